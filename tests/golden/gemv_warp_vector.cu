extern "C" __global__ void __launch_bounds__(256) gemv_warp_vector(float* __restrict__ b48, const uint16_t* __restrict__ b47, const uint16_t* __restrict__ b16, const int64_t* __restrict__ kiln_sym) {
  const int kiln_lane = threadIdx.x % 32, kiln_offset = threadIdx.x / 32;
  const int64_t kiln_points = ((INT64_C(32)));
  for (int64_t kiln_first = (int64_t)blockIdx.x * 8; kiln_first < kiln_points; kiln_first += (int64_t)gridDim.x * 8) {
    const int64_t kiln_slot = kiln_first + kiln_offset;
    const int64_t kiln_point = kiln_slot < kiln_points ? kiln_slot : kiln_points - 1; (void)kiln_point;
    const int64_t i1 = kiln_point;
    float acc6 = 0;
    #pragma unroll
    for (int64_t kiln_base = kiln_lane * 8; kiln_base < (INT64_C(64)); kiln_base += 256) {
      float kv1[8]; kiln_bf16x8(kv1, b16 + (INT64_C(64)*i1 + kiln_base));
      float kv2[8]; kiln_bf16x8(kv2, b47 + (kiln_base));
      #pragma unroll
      for (int kiln_v = 0; kiln_v < 8; kiln_v++) {
        const int64_t r2 = kiln_base + kiln_v; (void)r2;
        const float t3 = ((float)(kv2[kiln_v]));
        const float t4 = ((float)(kv1[kiln_v]));
        const float t5 = (t3 * t4);
        acc6 = acc6 + (float)t5;
      }
    }
    { const float kiln_other = __shfl_xor_sync(0xffffffffu, acc6, 16); acc6 = acc6 + kiln_other; }
    { const float kiln_other = __shfl_xor_sync(0xffffffffu, acc6, 8); acc6 = acc6 + kiln_other; }
    { const float kiln_other = __shfl_xor_sync(0xffffffffu, acc6, 4); acc6 = acc6 + kiln_other; }
    { const float kiln_other = __shfl_xor_sync(0xffffffffu, acc6, 2); acc6 = acc6 + kiln_other; }
    { const float kiln_other = __shfl_xor_sync(0xffffffffu, acc6, 1); acc6 = acc6 + kiln_other; }
    const float t7 = (float)acc6;
    if (kiln_lane == 0 && kiln_slot < kiln_points) b48[(i1)] = t7;
  }
}

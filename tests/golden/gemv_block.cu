extern "C" __global__ void __launch_bounds__(256) gemv_block(float* __restrict__ b48, const uint16_t* __restrict__ b47, const uint16_t* __restrict__ b16, const int64_t* __restrict__ kiln_sym) {
  __shared__ float kiln_shared6[8];
  const int kiln_lane = threadIdx.x % 256, kiln_offset = threadIdx.x / 256;
  const int64_t kiln_points = ((INT64_C(32)));
  for (int64_t kiln_first = (int64_t)blockIdx.x * 1; kiln_first < kiln_points; kiln_first += (int64_t)gridDim.x * 1) {
    const int64_t kiln_slot = kiln_first + kiln_offset;
    const int64_t kiln_point = kiln_slot < kiln_points ? kiln_slot : kiln_points - 1; (void)kiln_point;
    const int64_t i1 = kiln_point;
    float acc6 = 0;
    #pragma unroll
    for (int64_t r2 = kiln_lane; r2 < (INT64_C(64)); r2 += 256) {
      const float t1 = kiln_bf16_load(b47[(r2)]);
      const float t2 = ((float)(t1));
      const float t3 = kiln_bf16_load(b16[(INT64_C(64)*i1 + r2)]);
      const float t4 = ((float)(t3));
      const float t5 = (t2 * t4);
      acc6 = acc6 + (float)t5;
    }
    { const float kiln_other = __shfl_xor_sync(0xffffffffu, acc6, 16); acc6 = acc6 + kiln_other; }
    { const float kiln_other = __shfl_xor_sync(0xffffffffu, acc6, 8); acc6 = acc6 + kiln_other; }
    { const float kiln_other = __shfl_xor_sync(0xffffffffu, acc6, 4); acc6 = acc6 + kiln_other; }
    { const float kiln_other = __shfl_xor_sync(0xffffffffu, acc6, 2); acc6 = acc6 + kiln_other; }
    { const float kiln_other = __shfl_xor_sync(0xffffffffu, acc6, 1); acc6 = acc6 + kiln_other; }
    if ((threadIdx.x & 31) == 0) kiln_shared6[threadIdx.x >> 5] = acc6;
    __syncthreads();
    acc6 = kiln_shared6[0];
    for (int kiln_w = 1; kiln_w < 8; kiln_w++) acc6 = acc6 + kiln_shared6[kiln_w];
    __syncthreads();
    const float t8 = (float)acc6;
    if (kiln_lane == 0 && kiln_slot < kiln_points) b48[(i1)] = t8;
  }
}

extern "C" __global__ void __launch_bounds__(256) gemv_block(float* __restrict__ b47, const float* __restrict__ b46, const uint16_t* __restrict__ b15, const int64_t* __restrict__ kiln_sym) {
  __shared__ float kiln_shared5[8];
  const int kiln_lane = threadIdx.x % 256;
  const int64_t kiln_points = ((INT64_C(32)));
  for (int64_t kiln_point = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 256; kiln_point < kiln_points; kiln_point += (int64_t)gridDim.x * blockDim.x / 256) {
    const int64_t i1 = kiln_point;
    float acc5 = 0;
    #pragma unroll 4
    for (int64_t r2 = kiln_lane; r2 < (INT64_C(64)); r2 += 256) {
      const float t1 = b46[(r2)];
      const float t2 = kiln_bf16_load(b15[(INT64_C(64)*i1 + r2)]);
      const float t3 = ((float)(t2));
      const float t4 = (t1 * t3);
      acc5 = acc5 + (float)t4;
    }
    { const float kiln_other = __shfl_xor_sync(0xffffffffu, acc5, 16); acc5 = acc5 + kiln_other; }
    { const float kiln_other = __shfl_xor_sync(0xffffffffu, acc5, 8); acc5 = acc5 + kiln_other; }
    { const float kiln_other = __shfl_xor_sync(0xffffffffu, acc5, 4); acc5 = acc5 + kiln_other; }
    { const float kiln_other = __shfl_xor_sync(0xffffffffu, acc5, 2); acc5 = acc5 + kiln_other; }
    { const float kiln_other = __shfl_xor_sync(0xffffffffu, acc5, 1); acc5 = acc5 + kiln_other; }
    if ((threadIdx.x & 31) == 0) kiln_shared5[kiln_lane >> 5] = acc5;
    __syncthreads();
    acc5 = kiln_shared5[0];
    for (int kiln_w = 1; kiln_w < 8; kiln_w++) acc5 = acc5 + kiln_shared5[kiln_w];
    __syncthreads();
    const float t6 = (float)acc5;
    if (kiln_lane == 0) b47[(i1)] = t6;
  }
}

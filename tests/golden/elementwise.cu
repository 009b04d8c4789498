extern "C" __global__ void __launch_bounds__(256) elementwise(float* __restrict__ b27, const float* __restrict__ b20, const float* __restrict__ b25, const float* __restrict__ b26, const int64_t* __restrict__ kiln_sym) {
  const int kiln_lane = threadIdx.x % 1;
  const int64_t kiln_points = ((INT64_C(2))) * ((INT64_C(16)));
  for (int64_t kiln_point = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 1; kiln_point < kiln_points; kiln_point += (int64_t)gridDim.x * blockDim.x / 1) {
    const int64_t i2 = kiln_point % (INT64_C(16));
    const int64_t kiln_rest1 = kiln_point / (INT64_C(16));
    const int64_t i1 = kiln_rest1;
    const float t1 = b20[(INT64_C(16)*i1 + i2)];
    const float t2 = kiln_bf16_round(((float)(t1)));
    const float t3 = ((float)(t2));
    const float t4 = b25[(i2)];
    const float t5 = (t3 * t4);
    const float t6 = kiln_bf16_round(((float)(t5)));
    const float t7 = ((float)(t6));
    const float t8 = b20[(INT64_C(16)*i1 + kiln_min((INT64_C(7)), (kiln_max(INT64_C(0), (i2)))) + INT64_C(8))];
    const float t9 = kiln_bf16_round(((float)(t8)));
    const float t10 = ((float)(t9));
    const float t11 = (t10 * -1.0f);
    const float t12 = kiln_bf16_round(((float)(t11)));
    const float t13 = b20[(INT64_C(16)*i1 + kiln_min((INT64_C(7)), (kiln_max(INT64_C(0), (i2 + INT64_C(-8))))))];
    const float t14 = kiln_bf16_round(((float)(t13)));
    const float t15 = kiln_bf16_round(((INT64_C(0) <= (i2) && (i2) < (INT64_C(8))) ? t12 : t14));
    const float t16 = ((float)(t15));
    const float t17 = b26[(i2)];
    const float t18 = (t16 * t17);
    const float t19 = kiln_bf16_round(((float)(t18)));
    const float t20 = ((float)(t19));
    const float t21 = (t7 + t20);
    const float t22 = kiln_bf16_round(((float)(t21)));
    const float t23 = ((float)(t22));
    const float t24 = (t23 * 0.5f);
    if (kiln_lane == 0) b27[(INT64_C(16)*i1 + i2)] = t24;
  }
}

extern "C" __global__ void __launch_bounds__(256) elementwise(float* __restrict__ b28, const float* __restrict__ b21, const uint16_t* __restrict__ b26, const uint16_t* __restrict__ b27, const int64_t* __restrict__ kiln_sym) {
  const int kiln_lane = threadIdx.x % 1, kiln_offset = threadIdx.x / 1;
  const int64_t kiln_points = ((INT64_C(2))) * ((INT64_C(16)));
  for (int64_t kiln_first = (int64_t)blockIdx.x * 256; kiln_first < kiln_points; kiln_first += (int64_t)gridDim.x * 256) {
    const int64_t kiln_slot = kiln_first + kiln_offset;
    const int64_t kiln_point = kiln_slot < kiln_points ? kiln_slot : kiln_points - 1; (void)kiln_point;
    const int kiln_flat = (int)kiln_point;
    const int64_t i2 = kiln_flat % (int)(INT64_C(16));
    const int kiln_rest1 = kiln_flat / (int)(INT64_C(16));
    const int64_t i1 = kiln_rest1;
    const float t1 = b21[(INT64_C(16)*i1 + i2)];
    const float t2 = kiln_bf16_round(((float)(t1)));
    const float t3 = ((float)(t2));
    const float t4 = kiln_bf16_load(b26[(i2)]);
    const float t5 = ((float)(t4));
    const float t6 = (t3 * t5);
    const float t7 = kiln_bf16_round(((float)(t6)));
    const float t8 = ((float)(t7));
    const float t9 = b21[(INT64_C(16)*i1 + kiln_min((INT64_C(7)), (kiln_max(INT64_C(0), (i2)))) + INT64_C(8))];
    const float t10 = kiln_bf16_round(((float)(t9)));
    const float t11 = ((float)(t10));
    const float t12 = (t11 * -1.0f);
    const float t13 = kiln_bf16_round(((float)(t12)));
    const float t14 = b21[(INT64_C(16)*i1 + kiln_min((INT64_C(7)), (kiln_max(INT64_C(0), (i2 + INT64_C(-8))))))];
    const float t15 = kiln_bf16_round(((float)(t14)));
    const float t16 = kiln_bf16_round(((INT64_C(0) <= (i2) && (i2) < (INT64_C(8))) ? t13 : t15));
    const float t17 = ((float)(t16));
    const float t18 = kiln_bf16_load(b27[(i2)]);
    const float t19 = ((float)(t18));
    const float t20 = (t17 * t19);
    const float t21 = kiln_bf16_round(((float)(t20)));
    const float t22 = ((float)(t21));
    const float t23 = (t8 + t22);
    const float t24 = kiln_bf16_round(((float)(t23)));
    const float t25 = ((float)(t24));
    const float t26 = (t25 * 0.5f);
    if (kiln_lane == 0 && kiln_slot < kiln_points) b28[(INT64_C(16)*i1 + i2)] = t26;
  }
}

// Row gather with dequantization (embedding lookup, tail-row selection): out row r is row
// ids[r] of a [n_rows, n_cols] matrix of storage type T, whose rows are `row_bytes` apart.
// One block per output row.
#include "quants.cuh"

#define GET_ROWS(T)                                                                              \
    extern "C" __global__ void get_rows_##T(const u8 *src, const i32 *ids, float *out, int n_cols, \
                                            i64 row_bytes) {                                    \
        const u8 *row = src + (i64)ids[blockIdx.x] * row_bytes;                                  \
        float *y = out + (i64)blockIdx.x * n_cols;                                               \
        for (int j = threadIdx.x; j < n_cols; j += blockDim.x) y[j] = dq_##T(row, j);            \
    }
FOR_EACH_TYPE(GET_ROWS)

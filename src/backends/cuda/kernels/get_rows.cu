// Row gather with dequantization (embedding lookup, tail-row selection): out row r is row
// ids[r] of a [n_rows, n_cols] matrix of storage type T, whose rows are `row_bytes` apart.
// One block per output row. An id outside 0..n_rows gives a row of NaNs (never a read outside
// the matrix); the engine validates token ids before they reach a device.
#include "quants.cuh"

#define GET_ROWS(T)                                                                              \
    extern "C" __global__ void get_rows_##T(const u8 *src, const i32 *ids, float *out, int n_cols, \
                                            i64 row_bytes, int n_rows) {                        \
        const i32 id = ids[blockIdx.x];                                                          \
        float *y = out + (i64)blockIdx.x * n_cols;                                               \
        if (id < 0 || id >= n_rows) {                                                            \
            for (int j = threadIdx.x; j < n_cols; j += blockDim.x) y[j] = __int_as_float(0x7fc00000); \
            return;                                                                              \
        }                                                                                        \
        const u8 *row = src + (i64)id * row_bytes;                                               \
        for (int j = threadIdx.x; j < n_cols; j += blockDim.x) y[j] = dq_##T(row, j);            \
    }
FOR_EACH_TYPE(GET_ROWS)

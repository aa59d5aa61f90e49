// Oracle: runs ggml's own code on deterministic inputs and prints JSON lines.
// Built twice: with GCC's defaults (-ffp-contract=fast, as llama.cpp's CMake build) and with
// -ffp-contract=off (strict C semantics); argv[1] is the suffix of the output field names.
#define GGML_COMMON_DECL_C
#include "ggml-common.h"
#include "ggml-quants.h"
#include "ggml-impl.h"
#include "ggml-cpu/quants.h"
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <stdlib.h>
#include <immintrin.h>

void ggml_vec_dot_bf16(int n, float * s, size_t bs, ggml_bf16_t * x, size_t bx, ggml_bf16_t * y, size_t by, int nrc);
void ggml_vec_dot_f16(int n, float * s, size_t bs, ggml_fp16_t * x, size_t bx, ggml_fp16_t * y, size_t by, int nrc);

static uint32_t rng = 0x9e3779b9u;
static uint32_t xs(void) { rng ^= rng << 13; rng ^= rng >> 17; rng ^= rng << 5; return rng; }
static float uni(void) { return (xs() >> 8) * (1.0f / 16777216.0f); } // [0,1)
static float gauss(void) { float s = 0; for (int i = 0; i < 4; i++) s += uni(); return (s - 2.0f) * 1.7f; }

static void hex(const char *key, const void *p, size_t n, const char *tag, int comma) {
    const uint8_t *b = p;
    printf("\"%s%s\":\"", key, tag);
    for (size_t i = 0; i < n; i++) printf("%02x", b[i]);
    printf("\"%s", comma ? "," : "");
}
static void f32bits(const char *key, const float *v, size_t n, const char *tag, int comma) {
    printf("\"%s%s\":\"", key, tag);
    for (size_t i = 0; i < n; i++) { uint32_t u; memcpy(&u, &v[i], 4); printf("%08x", u); }
    printf("\"%s", comma ? "," : "");
}
static uint16_t f16(float f) { return _cvtss_sh(f, 0); }

#define NQ 256
static void gen_row(int r, float *x) {
    float scale = powf(10.0f, (float)((int)(xs() % 9) - 4));
    for (int i = 0; i < NQ; i++) x[i] = gauss() * scale;
    switch (r) {
    case 0: memset(x, 0, NQ * 4); break;                                  // all zero
    case 1: for (int i = 0; i < NQ; i++) x[i] = (float)((i % 64) - 32) * 0.5f; break; // halves
    case 2: for (int i = 0; i < NQ; i++) x[i] = (i % 32 == 5) ? 127.0f : ((i % 7) - 3) + 0.5f; break;
    case 3: for (int i = 0; i < NQ; i++) x[i] = (i % 32 == 0) ? -127.0f : (float)(i % 13) - 6.5f; break;
    case 4: for (int i = 0; i < NQ; i++) x[i] *= 1e-38f; break;          // tiny: id overflows
    case 5: x[3] = INFINITY; x[40] = NAN; x[77] = -INFINITY; break;        // non-finite
    case 6: for (int i = 0; i < NQ; i++) x[i] = (float)(i % 255) - 127.0f; break;
    case 7: x[0] = 0; for (int i = 1; i < NQ; i++) x[i] = x[i-1] + 0.37f; break;
    case 8: for (int i = 0; i < 128; i++) x[i] = 0; break;               // half zero (Q8_K blocks of 256 not zero)
    case 9: for (int i = 0; i < NQ; i++) x[i] = 3e38f * gauss() / 4; break; // huge
    case 10: { // values where GCC's fused iscale*x+magic rounds differently from the plain product
        x[0] = 3.0f; const float iscale = -127.f / 3.0f; int k = 1;
        while (k < NQ) {
            float v = uni() * 3.0f;
            volatile float prod = iscale * v; float pv = prod;
            float a = pv + 12582912.f; float b = fmaf(iscale, v, 12582912.f);
            if (a != b) x[k++] = v;
        }
    } break;
    default: break;
    }
}

static void fill_weights(int type, uint8_t *w, int nb, size_t bsz) {
    for (size_t i = 0; i < nb * bsz; i++) w[i] = xs() & 0xff;
    for (int b = 0; b < nb; b++) {
        uint8_t *p = w + b * bsz;
        float d = (0.002f + uni() * 0.05f) * ((type == GGML_TYPE_Q4_0 || type == GGML_TYPE_Q8_0 || type == GGML_TYPE_Q5_0) && (xs() & 1) ? -1 : 1);
        float m = -(0.01f + uni() * 0.3f);
        uint16_t hd = f16(d), hm = f16(m), hmin = f16(0.001f + uni() * 0.02f);
        switch (type) {
        case GGML_TYPE_Q4_0: case GGML_TYPE_Q5_0: case GGML_TYPE_Q8_0: memcpy(p, &hd, 2); break;
        case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_1: memcpy(p, &hd, 2); memcpy(p + 2, &hm, 2); break;
        case GGML_TYPE_Q2_K: memcpy(p + 80, &hd, 2); memcpy(p + 82, &hmin, 2); break;
        case GGML_TYPE_Q3_K: memcpy(p + 108, &hd, 2); break;
        case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: memcpy(p, &hd, 2); memcpy(p + 2, &hmin, 2); break;
        case GGML_TYPE_Q6_K: { uint16_t h6 = f16(d * 0.05f); memcpy(p + 208, &h6, 2); } break;
        }
    }
}

typedef void (*dot_fn)(int, float *, size_t, const void *, size_t, const void *, size_t, int);
typedef void (*deq_fn)(const void *, float *, int64_t);
struct wt { int type; const char *name; size_t bsz; int qk; dot_fn generic; dot_fn simd; deq_fn deq; int act; };

int main(int argc, char **argv) {
    // argv[1]: suffix for output fields ("_fast" or "_off")
    const char *tag = argc > 1 ? argv[1] : "";
    float x[NQ];
    // ---- activation quantizers
    for (int r = 0; r < 16; r++) {
        gen_row(r, x);
        block_q8_0 a0[NQ / 32], a0r[NQ / 32];
        block_q8_1 a1[NQ / 32], a1r[NQ / 32];
        block_q8_K ak;
        memset(&ak, 0x55, sizeof ak); // stale bsums show through for all-zero blocks
        quantize_row_q8_0(x, a0, NQ);
        quantize_row_q8_0_ref(x, a0r, NQ);
        quantize_row_q8_1(x, a1, NQ);
        quantize_row_q8_1_ref(x, a1r, NQ);
        quantize_row_q8_K(x, &ak, NQ);
        printf("{\"kind\":\"quant\",\"row\":%d,", r);
        f32bits("x", x, NQ, "", 1);
        hex("q8_0", a0, sizeof a0, tag, 1);
        hex("q8_0_ref", a0r, sizeof a0r, tag, 1);
        hex("q8_1", a1, sizeof a1, tag, 1);
        hex("q8_1_ref", a1r, sizeof a1r, tag, 1);
        hex("q8_k", &ak, sizeof ak, tag, 0);
        printf("}\n");
    }
    // ---- dot products and dequantization
    struct wt wts[] = {
        {GGML_TYPE_Q4_0, "Q4_0", 18, 32, ggml_vec_dot_q4_0_q8_0_generic, ggml_vec_dot_q4_0_q8_0, (deq_fn)dequantize_row_q4_0, 0},
        {GGML_TYPE_Q4_1, "Q4_1", 20, 32, ggml_vec_dot_q4_1_q8_1_generic, ggml_vec_dot_q4_1_q8_1, (deq_fn)dequantize_row_q4_1, 1},
        {GGML_TYPE_Q5_0, "Q5_0", 22, 32, ggml_vec_dot_q5_0_q8_0_generic, ggml_vec_dot_q5_0_q8_0, (deq_fn)dequantize_row_q5_0, 0},
        {GGML_TYPE_Q5_1, "Q5_1", 24, 32, ggml_vec_dot_q5_1_q8_1_generic, ggml_vec_dot_q5_1_q8_1, (deq_fn)dequantize_row_q5_1, 1},
        {GGML_TYPE_Q8_0, "Q8_0", 34, 32, ggml_vec_dot_q8_0_q8_0_generic, ggml_vec_dot_q8_0_q8_0, (deq_fn)dequantize_row_q8_0, 0},
        {GGML_TYPE_Q2_K, "Q2_K", 84, 256, ggml_vec_dot_q2_K_q8_K_generic, ggml_vec_dot_q2_K_q8_K, (deq_fn)dequantize_row_q2_K, 2},
        {GGML_TYPE_Q3_K, "Q3_K", 110, 256, ggml_vec_dot_q3_K_q8_K_generic, ggml_vec_dot_q3_K_q8_K, (deq_fn)dequantize_row_q3_K, 2},
        {GGML_TYPE_Q4_K, "Q4_K", 144, 256, ggml_vec_dot_q4_K_q8_K_generic, ggml_vec_dot_q4_K_q8_K, (deq_fn)dequantize_row_q4_K, 2},
        {GGML_TYPE_Q5_K, "Q5_K", 176, 256, ggml_vec_dot_q5_K_q8_K_generic, ggml_vec_dot_q5_K_q8_K, (deq_fn)dequantize_row_q5_K, 2},
        {GGML_TYPE_Q6_K, "Q6_K", 210, 256, ggml_vec_dot_q6_K_q8_K_generic, ggml_vec_dot_q6_K_q8_K, (deq_fn)dequantize_row_q6_K, 2},
    };
    enum { N = 512 };
    static uint8_t w[N / 32 * 210];
    float xa[N], deq[N];
    for (size_t t = 0; t < sizeof wts / sizeof wts[0]; t++) {
        for (int r = 0; r < 4; r++) {
            int nb = N / wts[t].qk;
            fill_weights(wts[t].type, w, nb, wts[t].bsz);
            float sc = powf(10.0f, (float)((int)(xs() % 5) - 2));
            for (int i = 0; i < N; i++) xa[i] = gauss() * sc;
            union { block_q8_0 q0[N / 32]; block_q8_1 q1[N / 32]; block_q8_K qk[N / 256]; } act;
            size_t asz;
            if (wts[t].act == 0) { quantize_row_q8_0(xa, act.q0, N); asz = sizeof act.q0; }
            else if (wts[t].act == 1) { quantize_row_q8_1(xa, act.q1, N); asz = sizeof act.q1; }
            else { quantize_row_q8_K(xa, act.qk, N); asz = sizeof act.qk; }
            float g, s;
            wts[t].generic(N, &g, 0, w, 0, &act, 0, 1);
            wts[t].simd(N, &s, 0, w, 0, &act, 0, 1);
            wts[t].deq(w, deq, N);
            printf("{\"kind\":\"dot\",\"type\":\"%s\",\"row\":%d,", wts[t].name, r);
            hex("w", w, nb * wts[t].bsz, "", 1);
            hex("a", &act, asz, "", 1);
            f32bits("generic", &g, 1, tag, 1);
            f32bits("simd", &s, 1, tag, 1);
            f32bits("dequant", deq, N, tag, 0);
            printf("}\n");
        }
    }
    // float types
    for (int r = 0; r < 3; r++) {
        static ggml_fp16_t hw[N], hx[N];
        static ggml_bf16_t bw[N], bx[N];
        for (int i = 0; i < N; i++) {
            float a = gauss() * 0.1f, b = gauss();
            hw[i] = f16(a); hx[i] = f16(b);
            bw[i] = GGML_FP32_TO_BF16(a); bx[i] = GGML_FP32_TO_BF16(b);
        }
        float s;
        ggml_vec_dot_f16(N, &s, 0, hw, 0, hx, 0, 1);
        printf("{\"kind\":\"fdot\",\"type\":\"F16\",\"row\":%d,", r);
        hex("w", hw, sizeof hw, "", 1); hex("a", hx, sizeof hx, "", 1); f32bits("simd", &s, 1, tag, 0);
        printf("}\n");
        ggml_vec_dot_bf16(N, &s, 0, bw, 0, bx, 0, 1);
        printf("{\"kind\":\"fdot\",\"type\":\"BF16\",\"row\":%d,", r);
        hex("w", bw, sizeof bw, "", 1); hex("a", bx, sizeof bx, "", 1); f32bits("simd", &s, 1, tag, 0);
        printf("}\n");
    }
    return 0;
}

// Oracle for minfer's vec_ops (tests/ops_ggml_oracle.rs): runs ggml's own CPU kernels on
// deterministic inputs and prints one line per case:
//   "<name> <count> <fnv1a64 of the f32 bit patterns, little-endian>"
// and writes every value's bits to /tmp/minfer-ops-oracle/full.txt (for MINFER_OPS_ORACLE_FULL).
//
// Build (ggml of the llama.cpp bundled with llama-cpp-python 0.3.36, as its CMake builds it;
// the source tree must be writable for CMake, and needs an empty ggml.pc.in):
//   cmake -S ggml -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
//         -DGGML_LLAMAFILE=ON -DBUILD_SHARED_LIBS=OFF -DGGML_OPENMP=OFF && ninja -C build
//   g++ -O3 -DNDEBUG -std=gnu++17 -march=native -Iggml/include -Iggml/src -Iggml/src/ggml-cpu \
//       ops_ggml_oracle_driver.cpp -o driver build/src/libggml-cpu.a build/src/libggml-base.a -lpthread -lm
//   mkdir -p /tmp/minfer-ops-oracle && ./driver
// It needs an AVX-512 CPU (it calls the AVX-512 ggml_v_expf directly).
#include "ggml.h"
#include "ggml-cpu.h"
#include "vec.h"
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <vector>
#include <string>

static FILE * full;

static std::vector<float> gen(uint32_t seed, size_t n, float scale) {
    uint32_t s = seed * 2654435761u + 1u;
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13; s ^= s >> 17; s ^= s << 5;
        float u = (float)(s >> 8) / (float)(1u << 23) - 1.0f;
        v[i] = u * scale;
    }
    return v;
}

static void emit(const std::string & name, const float * y, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        uint32_t b; memcpy(&b, &y[i], 4);
        for (int k = 0; k < 4; k++) { h ^= (b >> (8 * k)) & 0xff; h *= 0x100000001b3ull; }
    }
    printf("%s %zu %016llx\n", name.c_str(), n, (unsigned long long) h);
    fprintf(full, "%s", name.c_str());
    for (size_t i = 0; i < n; i++) { uint32_t b; memcpy(&b, &y[i], 4); fprintf(full, " %08x", b); }
    fprintf(full, "\n");
}

static ggml_context * new_ctx() {
    ggml_init_params ip = { (size_t) 256 << 20, NULL, false };
    return ggml_init(ip);
}

static ggml_tensor * tensor(ggml_context * ctx, const std::vector<float> & v, int64_t a, int64_t b = 1, int64_t c = 1) {
    ggml_tensor * t = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, a, b, c);
    memcpy(t->data, v.data(), v.size() * 4);
    return t;
}

static void run(ggml_context * ctx, ggml_tensor * out, const std::string & name) {
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    ggml_graph_compute_with_ctx(ctx, gf, 1);
    emit(name, (const float *) out->data, ggml_nelements(out));
}

int main() {
    full = fopen("/tmp/minfer-ops-oracle/full.txt", "w");
    // expf: ggml_v_expf lane by lane (AVX-512 build), on random values and special ones.
    {
        std::vector<float> x = gen(11, 4096, 110.0f);
        const float sp[16] = {0.0f, -0.0f, INFINITY, -INFINITY, 88.7f, 88.8f, -103.9f, -104.0f,
                              89.0f, -87.3f, -150.0f, 1e-30f, -1e-30f, 126.5f, -130.0f, 0.5f};
        x.insert(x.end(), sp, sp + 16);
        std::vector<float> y(x.size());
        for (size_t i = 0; i < x.size(); i += 16) _mm512_storeu_ps(&y[i], ggml_v_expf(_mm512_loadu_ps(&x[i])));
        emit("expf", y.data(), y.size());
    }
    {
        std::vector<float> x = gen(12, 1003, 20.0f), y(1003);
        ggml_vec_silu_f32(1003, y.data(), x.data());
        emit("silu_1003", y.data(), y.size());
        std::vector<float> g = gen(13, 1003, 20.0f), u = gen(14, 1003, 5.0f);
        ggml_vec_swiglu_f32(1003, y.data(), g.data(), u.data());
        emit("swiglu_1003", y.data(), y.size());
    }
    for (int n : {1, 15, 64, 70, 128, 200, 1000}) {
        std::vector<float> x = gen(20 + n, n, 1.0f), y = gen(40 + n, n, 1.0f);
        float s;
        ggml_vec_dot_f32(n, &s, 0, x.data(), 0, y.data(), 0, 1);
        emit("dot_" + std::to_string(n), &s, 1);
    }
    {   // rms_norm then mul, as llama.cpp's build_norm; and without the weight.
        ggml_context * ctx = new_ctx();
        ggml_tensor * x = tensor(ctx, gen(50, 896 * 3, 2.0f), 896, 3);
        ggml_tensor * w = tensor(ctx, gen(51, 896, 1.0f), 896);
        run(ctx, ggml_mul(ctx, ggml_rms_norm(ctx, x, 1e-6f), w), "rms_norm");
        run(ctx, ggml_rms_norm(ctx, x, 1e-6f), "rms_norm_noweight");
        ggml_tensor * q = tensor(ctx, gen(52, 128 * 4 * 3, 3.0f), 128, 4, 3);
        ggml_tensor * qw = tensor(ctx, gen(53, 128, 1.5f), 128);
        run(ctx, ggml_mul(ctx, ggml_rms_norm(ctx, q, 1e-6f), qw), "qk_norm");
        ggml_free(ctx);
    }
    struct RopeCase { const char * name; uint32_t seed; int hd, nh; std::vector<int> pos; float base; };
    for (const RopeCase & c : std::vector<RopeCase>{
             {"rope_64", 60, 64, 3, {0, 1, 17, 1000}, 1000000.0f},
             {"rope_128", 61, 128, 2, {5, 123456}, 1000000.0f},
             {"rope_128_b1e4", 62, 128, 2, {3, 4095}, 10000.0f}}) {
        ggml_context * ctx = new_ctx();
        int nt = c.pos.size();
        ggml_tensor * x = tensor(ctx, gen(c.seed, (size_t) c.hd * c.nh * nt, 2.0f), c.hd, c.nh, nt);
        ggml_tensor * p = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, nt);
        memcpy(p->data, c.pos.data(), nt * 4);
        run(ctx, ggml_rope_ext(ctx, x, p, NULL, c.hd, GGML_ROPE_TYPE_NEOX, 32768, c.base, 1.0f, 0.0f, 1.0f, 32.0f, 1.0f), c.name);
        ggml_free(ctx);
    }
    {   // soft_max_ext: plain rows of 300 (libm tail), and causal rows of 256 with a mask.
        ggml_context * ctx = new_ctx();
        ggml_tensor * a = tensor(ctx, gen(80, 300 * 3, 30.0f), 300, 3);
        run(ctx, ggml_soft_max_ext(ctx, a, NULL, 0.3f, 0.0f), "softmax_300");
        ggml_tensor * b = tensor(ctx, gen(81, 256 * 4, 30.0f), 256, 4);
        std::vector<float> m(256 * 4);
        const int valid[4] = {1, 17, 100, 256};
        for (int r = 0; r < 4; r++) for (int j = 0; j < 256; j++) m[r * 256 + j] = j < valid[r] ? 0.0f : -INFINITY;
        ggml_tensor * mask = tensor(ctx, m, 256, 4);
        run(ctx, ggml_soft_max_ext(ctx, b, mask, 0.125f, 0.0f), "softmax_causal_256");
        ggml_free(ctx);
    }
    // Attention, single-token path: kq = mul_mat(k, q); soft_max_ext(kq, mask, scale); kqv = mul_mat(v^T, kq).
    struct AttnCase { int hd, nh, nkv; std::vector<int> pos; };
    for (const AttnCase & c : std::vector<AttnCase>{{64, 4, 2, {0, 5, 15, 16, 63, 64, 100, 255}}, {128, 2, 1, {0, 37, 200}}}) {
        const int n_kv = 256, w = c.nkv * c.hd;
        std::vector<float> kc = gen(71 + c.hd, (size_t) n_kv * w, 1.0f), vc = gen(72 + c.hd, (size_t) n_kv * w, 1.0f);
        std::vector<float> kt((size_t) n_kv * w), vt((size_t) n_kv * w);
        for (int g = 0; g < c.nkv; g++) for (int j = 0; j < n_kv; j++) for (int d = 0; d < c.hd; d++) {
            kt[((size_t) g * n_kv + j) * c.hd + d] = kc[(size_t) j * w + g * c.hd + d];     // [hd, n_kv, nkv]
            vt[((size_t) g * c.hd + d) * n_kv + j] = vc[(size_t) j * w + g * c.hd + d];     // [n_kv, hd, nkv]
        }
        const float scale = 1.0f / sqrtf((float) c.hd);
        for (int p : c.pos) {
            ggml_context * ctx = new_ctx();
            ggml_tensor * q = tensor(ctx, gen(90 + p, (size_t) c.nh * c.hd, 1.0f), c.hd, 1, c.nh);
            ggml_tensor * k = tensor(ctx, kt, c.hd, n_kv, c.nkv);
            ggml_tensor * v = tensor(ctx, vt, n_kv, c.hd, c.nkv);
            std::vector<float> m(n_kv);
            for (int j = 0; j < n_kv; j++) m[j] = j <= p ? 0.0f : -INFINITY;
            ggml_tensor * mask = tensor(ctx, m, n_kv, 1);
            ggml_tensor * kq = ggml_soft_max_ext(ctx, ggml_mul_mat(ctx, k, q), mask, scale, 0.0f);
            run(ctx, ggml_mul_mat(ctx, v, kq), "attn_" + std::to_string(c.hd) + "_pos" + std::to_string(p));
            ggml_free(ctx);
        }
    }
    fclose(full);
    return 0;
}

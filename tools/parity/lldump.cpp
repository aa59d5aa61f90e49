// lldump: llama.cpp's side of minfer's parity checks (not part of any build; see README.md).
//
// Evaluates --ids one token per llama_decode, as the reference data was made (f32 K and V
// cache, flash attention off, n_ctx 512, 2 threads), prints the top --top [id, logit] pairs of
// every position from --from on (one JSON array per line), optionally writes those positions'
// full logits to --logits-out (raw f32), and with --dump-pos P --dump-dir D writes every tensor
// the graph computes at position P to D/<name>.f32 (raw f32, ggml element order; a repeated
// name gets #1, #2, ...) plus D/index.tsv (name, op, type, shape, src0, src1). --embd-out F
// turns on llama.cpp's embeddings (pooling none) and writes every position's final hidden state
// (`t_embd`, after the output norm) to F (raw f32, n_embd per position).
#include "llama.h"
#include "ggml.h"
#include "ggml-backend.h"
#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include <map>
#include <algorithm>
#include <sys/stat.h>

struct DumpCtx {
    bool active = false;
    std::string dir;
    std::map<std::string, int> seen;
    FILE * index = nullptr;
};

static bool cb(struct ggml_tensor * t, bool ask, void * ud) {
    DumpCtx * d = (DumpCtx *) ud;
    if (ask) return d->active;
    if (!d->active) return true;
    std::string name = t->name;
    int n = d->seen[name]++;
    std::string fname = name + (n ? ("#" + std::to_string(n)) : "");
    std::vector<float> out;
    const int64_t ne0 = t->ne[0], ne1 = t->ne[1], ne2 = t->ne[2], ne3 = t->ne[3];
    std::vector<uint8_t> raw(ggml_nbytes(t));
    ggml_backend_tensor_get(t, raw.data(), 0, raw.size());
    for (int64_t i3 = 0; i3 < ne3; i3++)
    for (int64_t i2 = 0; i2 < ne2; i2++)
    for (int64_t i1 = 0; i1 < ne1; i1++)
    for (int64_t i0 = 0; i0 < ne0; i0++) {
        size_t off = i0 * t->nb[0] + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
        float v;
        if (t->type == GGML_TYPE_F32) memcpy(&v, raw.data() + off, 4);
        else if (t->type == GGML_TYPE_F16) { ggml_fp16_t h; memcpy(&h, raw.data() + off, 2); v = ggml_fp16_to_fp32(h); }
        else if (t->type == GGML_TYPE_I32) { int32_t x; memcpy(&x, raw.data() + off, 4); v = (float) x; }
        else { v = NAN; }
        out.push_back(v);
    }
    FILE * f = fopen((d->dir + "/" + fname + ".f32").c_str(), "wb");
    fwrite(out.data(), 4, out.size(), f);
    fclose(f);
    fprintf(d->index, "%s\t%s\t%s\t%lld,%lld,%lld,%lld\t%s\t%s\n", fname.c_str(), ggml_op_desc(t), ggml_type_name(t->type),
            (long long) ne0, (long long) ne1, (long long) ne2, (long long) ne3,
            t->src[0] ? t->src[0]->name : "", t->src[1] ? t->src[1]->name : "");
    return true;
}

int main(int argc, char ** argv) {
    const char * model_path = nullptr;
    std::vector<llama_token> ids;
    int from = 0, topk = 20, dump_pos = -1, threads = 2;
    const char * dump_dir = nullptr;
    const char * logits_out = nullptr;
    const char * embd_out = nullptr;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        if (a == "-m") model_path = argv[++i];
        else if (a == "--ids") { char * s = argv[++i]; char * tok = strtok(s, ","); while (tok) { ids.push_back(atoi(tok)); tok = strtok(nullptr, ","); } }
        else if (a == "--from") from = atoi(argv[++i]);
        else if (a == "--top") topk = atoi(argv[++i]);
        else if (a == "--dump-pos") dump_pos = atoi(argv[++i]);
        else if (a == "--dump-dir") dump_dir = argv[++i];
        else if (a == "--threads") threads = atoi(argv[++i]);
        else if (a == "--logits-out") logits_out = argv[++i];
        else if (a == "--embd-out") embd_out = argv[++i];
    }
    llama_backend_init();
    llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    auto mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    llama_model * model = llama_model_load_from_file(model_path, mp);
    if (!model) { fprintf(stderr, "load failed\n"); return 1; }
    DumpCtx dctx;
    if (dump_dir) { mkdir(dump_dir, 0755); dctx.dir = dump_dir; dctx.index = fopen((std::string(dump_dir) + "/index.tsv").c_str(), "w"); }
    auto cp = llama_context_default_params();
    cp.n_ctx = 512;
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    cp.type_k = GGML_TYPE_F32;
    cp.type_v = GGML_TYPE_F32;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    if (embd_out) { cp.embeddings = true; cp.pooling_type = LLAMA_POOLING_TYPE_NONE; }
    if (dump_dir) { cp.cb_eval = cb; cp.cb_eval_user_data = &dctx; }
    llama_context * ctx = llama_init_from_model(model, cp);
    const llama_vocab * vocab = llama_model_get_vocab(model);
    int n_vocab = llama_vocab_n_tokens(vocab);
    FILE * lf = logits_out ? fopen(logits_out, "wb") : nullptr;
    FILE * ef = embd_out ? fopen(embd_out, "wb") : nullptr;
    const int n_embd = llama_model_n_embd(model);
    for (size_t p = 0; p < ids.size(); p++) {
        dctx.active = ((int) p == dump_pos);
        llama_token t = ids[p];
        llama_batch b = llama_batch_get_one(&t, 1);
        if (llama_decode(ctx, b) != 0) { fprintf(stderr, "decode failed at %zu\n", p); return 1; }
        if (ef) fwrite(llama_get_embeddings_ith(ctx, -1), 4, n_embd, ef);
        if ((int) p >= from) {
            const float * lg = llama_get_logits_ith(ctx, -1);
            if (lf) fwrite(lg, 4, n_vocab, lf);
            std::vector<int> idx(n_vocab);
            for (int i = 0; i < n_vocab; i++) idx[i] = i;
            std::partial_sort(idx.begin(), idx.begin() + topk, idx.end(), [&](int a, int b) { return lg[a] > lg[b] || (lg[a] == lg[b] && a < b); });
            printf("[");
            for (int i = 0; i < topk; i++) printf("%s[%d, %.9g]", i ? ", " : "", idx[i], lg[idx[i]]);
            printf("]\n");
        }
    }
    if (lf) fclose(lf);
    if (ef) fclose(ef);
    if (dctx.index) fclose(dctx.index);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}

// Oracle dumps for kiln's vision tests (not part of kiln): llama.cpp's own pipeline.
//   oracle pre MODEL MMPROJ IMAGE OUT [enc]   decoded RGB + preprocessed f32 tiles (raw dumps);
//                                             with enc, each tile's embeddings (OUT.embd)
//   oracle run MODEL MMPROJ OUT N PROMPT IMAGE...   mtmd-cli's prompt, chunks, embeddings, logits, greedy ids
//   oracle raw MODEL MMPROJ OUT N TEXT IMAGE...     the same with TEXT as the formatted prompt (its
//                                                   markers placed; for a model without a chat
//                                                   template: TEXT as --chat-template NAME renders it)
#include "llama.h"
#include "mtmd.h"
#include "mtmd-helper.h"
#include "clip.h"
#include "clip-impl.h"
#include "mtmd-image.h"
std::string oracle_format_user(const llama_model * model, const std::string & prompt);
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>
#include <fstream>
#include <cmath>

static void wr(const std::string & p, const void * d, size_t n) {
    std::ofstream f(p, std::ios::binary); f.write((const char *) d, n);
}

static std::vector<unsigned char> rgb_of(mtmd_context * ctx, const char * path, int & nx, int & ny) {
    auto w = mtmd_helper_bitmap_init_from_file(ctx, path, false, mtmd_helper_init_opt_default());
    if (!w.bitmap) { fprintf(stderr, "cannot load %s\n", path); exit(1); }
    nx = mtmd_bitmap_get_nx(w.bitmap); ny = mtmd_bitmap_get_ny(w.bitmap);
    const unsigned char * d = mtmd_bitmap_get_data(w.bitmap);
    std::vector<unsigned char> v(d, d + mtmd_bitmap_get_n_bytes(w.bitmap));
    mtmd_bitmap_free(w.bitmap);
    return v;
}

int main(int argc, char ** argv) {
    std::string mode = argv[1];
    llama_backend_init();
    if (mode == "pre") {
        // needs a language model for mtmd_context: argv[2]=MODEL argv[3]=MMPROJ argv[4]=IMAGE argv[5]=OUT
        llama_model_params mp = llama_model_default_params();
        llama_model * model = llama_model_load_from_file(argv[2], mp);
        mtmd_context_params cp = mtmd_context_params_default();
        cp.use_gpu = false; cp.n_threads = 2; cp.warmup = false; cp.print_timings = false;
        mtmd_context * ctx = mtmd_init_from_file(argv[3], model, cp);
        int nx, ny;
        auto rgb = rgb_of(ctx, argv[4], nx, ny);
        std::string out = argv[5];
        wr(out + ".rgb", rgb.data(), rgb.size());
        clip_context_params ccp{};  // as mtmd sets them up for the CPU (flash attention: auto)
        ccp.use_gpu = false;
        ccp.flash_attn_type = CLIP_FLASH_ATTN_TYPE_AUTO;
        ccp.image_min_tokens = -1;
        ccp.image_max_tokens = -1;
        ccp.warmup = true;
        ccp.no_alloc = false;
        auto res = clip_init(argv[3], ccp);
        clip_image_u8 img; img.set_size({nx, ny}, false); img.cpy_buf(rgb);
        mtmd_image_preproc_out po;
        if (clip_get_projector_type(res.ctx_v) == PROJECTOR_TYPE_IDEFICS3) {
            po = mtmd_image_preprocessor_idefics3(res.ctx_v).preprocess(img);
        } else {
            po = mtmd_image_preprocessor_fixed_size(res.ctx_v).preprocess(img);
        }
        std::vector<const clip_image_f32 *> all;
        if (po.has_overview()) all.push_back(&po.overview);
        for (auto & e : po.entries) all.push_back(&e);
        FILE * f = fopen((out + ".tiles").c_str(), "wb");
        uint32_t hdr[4] = {(uint32_t) all.size(), (uint32_t) po.grid_x, (uint32_t) po.grid_y, (uint32_t) po.has_overview()};
        fwrite(hdr, 4, 4, f);
        for (auto * e : all) {
            uint32_t s[2] = {(uint32_t) e->nx(), (uint32_t) e->ny()};
            fwrite(s, 4, 2, f);
            fwrite(e->get_ro_buf().data(), 4, e->get_ro_buf().size(), f);
        }
        fclose(f);
        if (argc > 6 && std::string(argv[6]) == "enc") {
            FILE * fe = fopen((out + ".embd").c_str(), "wb");
            for (auto * e : all) {
                std::vector<float> v((size_t) clip_n_output_tokens(res.ctx_v, (clip_image_f32 *) e) * clip_n_mmproj_embd(res.ctx_v));
                if (!clip_image_encode(res.ctx_v, 2, (clip_image_f32 *) e, v)) { fprintf(stderr, "encode failed\n"); return 1; }
                fwrite(v.data(), 4, v.size(), fe);
            }
            fclose(fe);
        }
        printf("%d x %d -> %zu tiles (grid %d x %d, overview %d)\n", nx, ny, all.size(), po.grid_x, po.grid_y, (int) po.has_overview());
        return 0;
    }
    // run
    const char * model_path = argv[2], * mmproj = argv[3];
    std::string out = argv[4];
    int n_gen = atoi(argv[5]);
    std::string prompt = argv[6];
    std::vector<const char *> images(argv + 7, argv + argc);
    llama_model_params mp = llama_model_default_params();
    llama_model * model = llama_model_load_from_file(model_path, mp);
    llama_context_params lp = llama_context_default_params();
    lp.n_ctx = 4096; lp.n_batch = 2048; lp.n_ubatch = 512; lp.n_threads = 2; lp.n_threads_batch = 2;
    llama_context * lctx = llama_init_from_model(model, lp);
    mtmd_context_params cp = mtmd_context_params_default();
    cp.use_gpu = false; cp.n_threads = 2; cp.print_timings = false;
    mtmd_context * ctx = mtmd_init_from_file(mmproj, model, cp);
    const bool raw = mode == "raw";
    if (!raw && prompt.find(mtmd_default_marker()) == std::string::npos)
        for (size_t i = 0; i < images.size(); i++) prompt = std::string(mtmd_default_marker()) + prompt;
    std::string formatted = raw ? prompt : oracle_format_user(model, prompt);
    wr(out + ".prompt.txt", formatted.data(), formatted.size());
    std::vector<mtmd_bitmap *> bms;
    for (auto * p : images) {
        auto w = mtmd_helper_bitmap_init_from_file(ctx, p, false, mtmd_helper_init_opt_default());
        if (!w.bitmap) { fprintf(stderr, "cannot load %s\n", p); return 1; }
        bms.push_back(w.bitmap);
    }
    mtmd_input_text txt{formatted.c_str(), formatted.size(), true, true};
    mtmd_input_chunks * chunks = mtmd_input_chunks_init();
    int r = mtmd_tokenize(ctx, chunks, &txt, (const mtmd_bitmap **) bms.data(), bms.size());
    if (r) { fprintf(stderr, "tokenize failed %d\n", r); return 1; }
    FILE * layout = fopen((out + ".chunks.txt").c_str(), "w");
    FILE * embd_f = fopen((out + ".embd").c_str(), "wb");
    llama_pos n_past = 0;
    int n_embd = llama_model_n_embd(model);
    size_t nc = mtmd_input_chunks_size(chunks);
    for (size_t i = 0; i < nc; i++) {
        auto c = mtmd_input_chunks_get(chunks, i);
        llama_pos np = n_past;
        if (mtmd_input_chunk_get_type(c) == MTMD_INPUT_CHUNK_TYPE_TEXT) {
            size_t n; auto t = mtmd_input_chunk_get_tokens_text(c, &n);
            fprintf(layout, "text");
            for (size_t j = 0; j < n; j++) fprintf(layout, " %d", t[j]);
            fprintf(layout, "\n");
            r = mtmd_helper_eval_chunk_single(ctx, lctx, c, n_past, 0, 512, i == nc - 1, &np);
        } else {
            size_t n = mtmd_input_chunk_get_n_tokens(c);
            fprintf(layout, "image %zu\n", n);
            r = mtmd_encode_chunk(ctx, c);
            if (r) { fprintf(stderr, "encode failed\n"); return 1; }
            float * e = mtmd_get_output_embd(ctx);
            fwrite(e, 4, n * n_embd, embd_f);
            r = mtmd_helper_decode_image_chunk(ctx, lctx, c, e, n_past, 0, 512, &np, nullptr, nullptr);
        }
        if (r) { fprintf(stderr, "eval failed at chunk %zu: %d\n", i, r); return 1; }
        n_past = np;
    }
    fclose(layout); fclose(embd_f);
    int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    std::vector<int> ids;
    const float * lg = llama_get_logits_ith(lctx, -1);
    wr(out + ".logits", lg, 4 * n_vocab);
    const llama_vocab * vocab = llama_model_get_vocab(model);
    for (int k = 0; k < n_gen; k++) {
        const float * l = llama_get_logits_ith(lctx, -1);
        int best = 0; for (int v = 1; v < n_vocab; v++) if (l[v] > l[best]) best = v;
        ids.push_back(best);
        if (llama_vocab_is_eog(vocab, best)) break;
        llama_batch b = llama_batch_get_one(&best, 1);
        if (llama_decode(lctx, b)) { fprintf(stderr, "decode failed\n"); return 1; }
    }
    FILE * fi = fopen((out + ".ids.txt").c_str(), "w");
    for (int id : ids) fprintf(fi, "%d ", id);
    fprintf(fi, "\n"); fclose(fi);
    printf("n_past %d, generated %zu\n", n_past, ids.size());
    return 0;
}

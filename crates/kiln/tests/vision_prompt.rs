//! Images in prompts against llama.cpp (`llama-mtmd-cli`'s prompt through libmtmd on the same
//! files; `scripts/gen-vision-fixtures`): SmolLM2-135M with SmolVLM's image tokens added and
//! the tiny synthetic idefics3 encoder, and gemma3-270m with the tiny synthetic gemma3 encoder
//! (its image rows read with bidirectional attention among them, as llama.cpp decodes them
//! with causal attention off). The prompt's layout (text ids around each tile's image rows)
//! equal, the next-token logits within the real model's tolerances, greedy ids equal up to
//! llama.cpp's own near-ties, and another image leads elsewhere. A follow-up turn reuses the
//! image's KV; bad inputs are clear errors.

mod support;

use kiln::chat::Message;
use kiln::engine::Device;
use kiln::gguf::GgufFile;
use kiln::vision::{synth, RgbImage, MEDIA_MARKER};
use kiln::{Engine, EngineOptions};
use support::*;

/// SmolLM2 with the image tokens, the idefics3-tiny mmproj and (for the mismatch check) the
/// gemma3-tiny one, written once into a temporary directory.
fn files() -> std::path::PathBuf {
    static DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("kiln-vision-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let lm = GgufFile::open(model(SMOLLM2.name)).unwrap();
        synth::with_added_tokens(&lm, &synth::smolvlm_image_tokens())
            .unwrap()
            .write_file(dir.join("lm.gguf"))
            .unwrap();
        for p in ["idefics3-tiny-mmproj", "gemma3-tiny-mmproj"] {
            synth::preset(p).unwrap().build().unwrap().write_file(dir.join(format!("{p}.gguf"))).unwrap();
        }
        dir
    })
    .clone()
}

fn engine(mmproj: Option<&str>) -> kiln::Result<Engine> {
    let dir = files();
    // The encoder in llama.cpp's arithmetic: the language model amplifies the image rows'
    // rounding (vision_encoder.rs checks the AMX tiles' rows against llama.cpp's).
    let mut opts = EngineOptions::default().with_n_ctx(512).with_threads(2).with_encoder_amx(false);
    if let Some(p) = mmproj {
        opts = opts.with_mmproj(dir.join(format!("{p}.gguf")));
    }
    Engine::load(dir.join("lm.gguf").to_str().unwrap(), opts)
}

/// gemma3-270m with the tiny gemma3 mmproj, on `device`, with micro-batches of `n_batch`.
fn gemma3(device: Device, n_batch: usize) -> kiln::Result<Engine> {
    let opts =
        EngineOptions::default().with_n_ctx(512).with_threads(2).with_device(device).with_batch(n_batch);
    let opts = opts.with_encoder_amx(false).with_mmproj(files().join("gemma3-tiny-mmproj.gguf"));
    Engine::load(model(GEMMA3.name).to_str().unwrap(), opts)
}

fn image(name: &str) -> RgbImage {
    RgbImage::open(fixtures().join("vision").join(name)).unwrap()
}

fn log_softmax_at(v: &[f32], i: usize) -> f64 {
    let m = v.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let s: f64 = v.iter().map(|&x| (x as f64 - m).exp()).sum();
    v[i] as f64 - m - s.ln()
}

fn floats(rel: &str) -> Vec<f32> {
    let raw = std::fs::read(fixtures().join(rel)).unwrap();
    raw.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect()
}

/// Bars on kiln's next-token logits against llama.cpp's: the largest difference, the largest
/// log-probability difference over llama.cpp's top 20, the difference of the largest logits
/// and the normalized squared error (infinite: not checked).
#[derive(Clone, Copy, Debug)]
struct Bars {
    max_abs: f32,
    max_lp: f64,
    d_max: f32,
    nmse: f64,
}

/// SmolLM2-135M after kiln's image rows: its tolerances (tests/oracle_models.rs); the image
/// rows differ from llama.cpp's by the encoder's rounding (vision_encoder.rs), which the
/// language model carries on.
const SMOLLM2_BARS: Bars = Bars { max_abs: 0.5, max_lp: 0.5, d_max: f32::INFINITY, nmse: f64::INFINITY };
/// SmolLM2 after llama.cpp's own image rows: llama.cpp's logits to rounding.
const SMOLLM2_ROWS_BARS: Bars =
    Bars { max_abs: 0.02, max_lp: 0.01, d_max: f32::INFINITY, nmse: f64::INFINITY };
/// gemma3-270m: on text alone kiln's logits are already this far from llama.cpp's CPU build
/// (the fixtures' prompt without its image: top-20 |Δ logprob| 0.28, |Δ max logit| 0.29,
/// NMSE 4.4e-3), so the bars are its tolerances (tests/oracle_models.rs: the top 20 within
/// 0.75, the largest logit within 0.5) and an NMSE. Reading the image's rows causally misses
/// every one (1.10, 1.17, 3.0e-2 on test-1).
const GEMMA3_BARS: Bars = Bars { max_abs: f32::INFINITY, max_lp: 0.75, d_max: 0.5, nmse: 1e-2 };
/// gemma3-270m after llama.cpp's own image rows (causally: 1.15, 1.25, 3.5e-2).
const GEMMA3_ROWS_BARS: Bars = Bars { max_abs: f32::INFINITY, max_lp: 0.5, d_max: 0.4, nmse: 5e-3 };

/// Checks kiln's logits against llama.cpp's after the prompt of `stem` with `preset`.
fn compare_logits(stem: &str, preset: &str, got: &[f32], bars: Bars) {
    let want = floats(&format!("vision/run/{stem}.{preset}.logits.f32"));
    assert_eq!(got.len(), want.len());
    let max_abs = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    let top = kiln::eval::top_k(&want, 20);
    let max_lp = top
        .iter()
        .map(|&(id, _)| (log_softmax_at(got, id as usize) - log_softmax_at(&want, id as usize)).abs())
        .fold(0.0f64, f64::max);
    let max = |v: &[f32]| v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let d_max = (max(got) - max(&want)).abs();
    let err: f64 = got.iter().zip(&want).map(|(&a, &b)| ((a - b) as f64).powi(2)).sum();
    let nmse = err / want.iter().map(|&b| (b as f64).powi(2)).sum::<f64>();
    eprintln!(
        "{stem} {preset}: max |Δ logit| {max_abs:.4}, max |Δ logprob| over top 20 {max_lp:.4}, \
         |Δ max logit| {d_max:.4}, NMSE {nmse:.2e}"
    );
    assert!(
        max_abs < bars.max_abs && max_lp < bars.max_lp && d_max < bars.d_max && nmse < bars.nmse,
        "{stem} {preset}: beyond {bars:?}"
    );
}

/// Runs the fixture of `stem` with `preset` and returns kiln's greedy ids, llama.cpp's up to
/// kiln's first near-tie (`tau`: the model's near-tie margin).
fn check(e: &Engine, stem: &str, preset: &str, bars: Bars, tau: f32) -> Vec<u32> {
    let fx = fixture_json(&format!("vision/run/{stem}.{preset}.json"));
    let mut s = e.session(Default::default()).unwrap();
    let img = image(fx["image"].as_str().unwrap());
    let prompt = fx["prompt"].as_str().unwrap();
    let ids = if fx["raw"].as_bool() == Some(true) {
        // The rendered text, its marker placed (a model without a chat template).
        let (before, after) = prompt.split_once(MEDIA_MARKER).unwrap();
        s.append_text(before).unwrap();
        s.append_image(&img).unwrap();
        s.append_text(after).unwrap();
        s.tokens()
    } else {
        s.append_chat_with_images(&[Message::user(prompt)], &[img]).unwrap()
    };

    // The layout: text chunks' ids equal, image chunks as runs of image-row ids.
    let n_vocab = e.config().n_vocab as u32;
    let mut at = 0;
    for c in fx["chunks"].as_array().unwrap() {
        if let Some(t) = c.get("text") {
            let t: Vec<u32> = t.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
            assert_eq!(&ids[at..at + t.len()], &t[..], "{stem}: text chunk at {at}");
            at += t.len();
        } else {
            let n = c["image"].as_u64().unwrap() as usize;
            assert!(ids[at..at + n].iter().all(|&id| id >= n_vocab), "{stem}: image rows at {at}");
            at += n;
        }
    }
    assert_eq!(at, ids.len(), "{stem}: prompt length");

    compare_logits(stem, preset, s.logits().unwrap(), bars);

    // Greedy, a step at a time, up to a near-tie of kiln's.
    let greedy: Vec<u32> =
        fx["greedy"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
    let mut out = Vec::new();
    for &w in &greedy {
        let logits = s.logits().unwrap();
        let best = argmax(logits);
        if best != w {
            let lead = logits[best as usize] - logits[w as usize];
            assert!(lead < tau, "{stem}: greedy step {}: {best}, llama.cpp {w} (lead {lead})", out.len());
            eprintln!(
                "{stem}: greedy step {}: a near-tie ({best} leads llama.cpp's {w} by {lead:.3})",
                out.len()
            );
            break;
        }
        out.push(w);
        s.append_tokens(&[w]).unwrap();
    }
    eprintln!("{stem}: {} of {} greedy ids identical to llama.cpp's", out.len(), greedy.len());
    out
}

/// The greedy ids of two images' prompts: at least `min` steps compared with llama.cpp's in
/// all, and the images lead to different ids within the steps both compared.
fn images_matter(a: &[u32], b: &[u32], min: usize) {
    assert!(a.len() + b.len() >= min, "only {} and {} greedy steps compared", a.len(), b.len());
    let n = a.len().min(b.len());
    assert_ne!(a[..n], b[..n], "the image must matter");
}

#[test]
fn image_prompts_match_llama_cpp() {
    let e = engine(Some("idefics3-tiny-mmproj")).unwrap();
    let a = check(&e, "test-1.stb", "idefics3-tiny-mmproj", SMOLLM2_BARS, SMOLLM2.tau());
    let b = check(&e, "alpha", "idefics3-tiny-mmproj", SMOLLM2_BARS, SMOLLM2.tau());
    images_matter(&a, &b, 8);
}

/// gemma3: `<start_of_image>`, the image's rows read bidirectionally, `<end_of_image>`.
#[test]
fn gemma3_image_prompts_match_llama_cpp() {
    let e = gemma3(Device::Cpu, 512).unwrap();
    let a = check(&e, "test-1.stb", "gemma3-tiny-mmproj", GEMMA3_BARS, GEMMA3.tau());
    let b = check(&e, "alpha", "gemma3-tiny-mmproj", GEMMA3_BARS, GEMMA3.tau());
    images_matter(&a, &b, 8);
}

/// gemma3-270m has no chat template: `--chat-template gemma` gives it llama.cpp's built-in
/// gemma format, and the prompt, logits and greedy ids are those of llama-mtmd-cli's
/// `--chat-template gemma` (the fixture's text chunks: the turn markers around the image).
/// The base model's first answer token is a near-tie (blank lines or not), so the greedy
/// ids stop there.
#[test]
fn gemma3_chat_template_by_name_matches_llama_cpp() {
    let opts = EngineOptions::default().with_n_ctx(512).with_threads(2).with_encoder_amx(false);
    let opts = opts.with_chat_template("gemma").with_mmproj(files().join("gemma3-tiny-mmproj.gguf"));
    let e = Engine::load(model(GEMMA3.name).to_str().unwrap(), opts).unwrap();
    check(&e, "test-1.stb.chat-template-gemma", "gemma3-tiny-mmproj", GEMMA3_BARS, GEMMA3.tau());
}

/// The same on the GPU backend (lavapipe in CI): the image step is the attention's
/// non-causal plan there too.
#[cfg(feature = "gpu")]
#[test]
fn gemma3_image_prompt_on_the_gpu_matches_llama_cpp() {
    let e = gemma3(Device::Gpu, 512).unwrap();
    eprintln!("{}", e.backend_name());
    let steps = check(&e, "test-1.stb", "gemma3-tiny-mmproj", GEMMA3_BARS, GEMMA3.tau()).len();
    assert!(steps >= 4, "only {steps} greedy steps compared");
}

/// The language model's side alone: llama.cpp's own image rows (its encoder's output, tiles
/// in the prompt's order: the global image last) placed by kiln where the chunks say give
/// llama.cpp's logits to rounding.
#[test]
fn llama_cpp_image_rows_give_llama_cpp_logits() {
    let e = engine(Some("idefics3-tiny-mmproj")).unwrap();
    llama_cpp_rows(&e, "idefics3-tiny-mmproj", SMOLLM2_ROWS_BARS);
}

/// gemma3's language model alone, reading llama.cpp's image rows bidirectionally.
#[test]
fn gemma3_llama_cpp_image_rows_give_llama_cpp_logits() {
    llama_cpp_rows(&gemma3(Device::Cpu, 512).unwrap(), "gemma3-tiny-mmproj", GEMMA3_ROWS_BARS);
}

fn llama_cpp_rows(e: &Engine, preset: &str, bars: Bars) {
    let d = e.config().n_embd;
    let stem = "test-1.stb";
    let fx = fixture_json(&format!("vision/run/{stem}.{preset}.json"));
    let mut rows = floats(&format!("vision/embd/{stem}.{preset}.f32"));
    let per_tile = e.vision().unwrap().config().n_tokens_per_image() * d;
    let n = rows.len();
    rows.rotate_left(per_tile % n); // preprocessing order has the global image first
    let r = e.runner();
    let seq = r.new_seq();
    let chunks = fx["chunks"].as_array().unwrap();
    let (mut at, mut logits) = (0, Vec::new());
    for (i, c) in chunks.iter().enumerate() {
        let last = i + 1 == chunks.len();
        if let Some(t) = c.get("text") {
            let n = t.as_array().unwrap().len();
            let entries: Vec<kiln::model::Entry> = t
                .as_array()
                .unwrap()
                .iter()
                .enumerate()
                .map(|(j, x)| kiln::model::Entry {
                    seq,
                    token: x.as_u64().unwrap() as u32,
                    output: last && j + 1 == n,
                })
                .collect();
            logits = r.decode(&entries, kiln::model::OutputKind::Logits).unwrap();
        } else {
            let n = c["image"].as_u64().unwrap() as usize;
            let ids: Vec<u32> = (0..n as u32).map(|k| 0x8000_0000 + (at / d) as u32 + k).collect();
            r.decode_embd(seq, &ids, &rows[at..at + n * d], false).unwrap();
            at += n * d;
        }
    }
    assert_eq!(at, rows.len());
    compare_logits(stem, preset, &logits, bars);
}

#[test]
fn a_follow_up_turn_reuses_the_image() {
    let e = engine(Some("idefics3-tiny-mmproj")).unwrap();
    let mut s = e.session(Default::default()).unwrap();
    let first =
        s.append_chat_with_images(&[Message::user("Describe this image.")], &[image("alpha.png")]).unwrap();
    let n0 = s.n_evaluated();
    assert_eq!(n0, first.len());
    s.append_chat_with_images(&[Message::assistant("A picture."), Message::user("What colors?")], &[])
        .unwrap();
    let more = s.n_evaluated() - n0;
    assert!(more < 32, "the follow-up evaluated {more} positions again");
    let err = s.save(files().join("session.json")).unwrap_err().to_string();
    assert!(err.contains("cannot be saved"), "{err}");
    // The same image in a new session: the prefix cache holds its whole blocks.
    let mut s2 = e.session(Default::default()).unwrap();
    s2.append_chat_with_images(&[Message::user("Describe this image.")], &[image("alpha.png")]).unwrap();
    assert!(s2.n_evaluated() < first.len() / 2, "{} of {} evaluated again", s2.n_evaluated(), first.len());
}

#[test]
fn bad_image_inputs_are_clear_errors() {
    let text_only = engine(None).unwrap();
    let mut s = text_only.session(Default::default()).unwrap();
    let e = s.append_chat_with_images(&[Message::user("hi")], &[image("tiny.png")]).unwrap_err().to_string();
    assert!(e.contains("takes no images"), "{e}");
    assert!(s.tokens().is_empty(), "nothing appended");

    let e = engine(Some("gemma3-tiny-mmproj")).err().unwrap().to_string();
    assert!(e.contains("not this model's mmproj"), "{e}");

    let e = EngineOptions::default().with_mmproj(files().join("lm.gguf"));
    let e =
        Engine::load(files().join("lm.gguf").to_str().unwrap(), e.with_n_ctx(256)).err().unwrap().to_string();
    assert!(e.contains("not an mmproj file"), "{e}");

    let vis = engine(Some("idefics3-tiny-mmproj")).unwrap();
    let mut s = vis.session(Default::default()).unwrap();
    let msg = Message::user(format!("{m}{m}two markers", m = kiln::vision::MEDIA_MARKER));
    let e = s.append_chat_with_images(&[msg], &[image("tiny.png")]).unwrap_err().to_string();
    assert!(e.contains("image markers"), "{e}");
    assert!(s.tokens().is_empty(), "nothing appended");
}

/// Two different images whose image-row ids coincide (ids hold 31 bits of the pixels' hash;
/// a birthday search over 8x8 images finds a pair): their prompts are the same ids, yet the
/// second never reuses the first's keys and values, in a new session through the prefix cache
/// or in one conversation holding both.
#[test]
fn images_with_the_same_ids_never_share_keys_and_values() {
    let (a, b) = {
        let mut seen = std::collections::HashMap::new();
        let img = |i: u32| {
            let data = (0..8 * 8 * 3).map(|j| (i.wrapping_mul(2_654_435_761) >> (j % 4 * 8)) as u8 ^ j as u8);
            RgbImage::new(8, 8, data.collect()).unwrap()
        };
        (0u32..)
            .find_map(|i| {
                let h = img(i).hash();
                let base = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) & 0x7fff_ffff;
                seen.insert(base, i).map(|j| (img(j), img(i)))
            })
            .unwrap()
    };
    assert_ne!(a, b);
    let ask = || [Message::user("Describe this image.")];
    let e = engine(Some("idefics3-tiny-mmproj")).unwrap();
    let mut sa = e.session(Default::default()).unwrap();
    let ids_a = sa.append_chat_with_images(&ask(), std::slice::from_ref(&a)).unwrap();
    let mut sb = e.session(Default::default()).unwrap();
    let ids_b = sb.append_chat_with_images(&ask(), std::slice::from_ref(&b)).unwrap();
    assert_eq!(ids_a, ids_b, "the same ids for both images");
    let first_row = ids_a.iter().position(|&t| t >= 0x8000_0000).unwrap();
    assert!(
        sb.n_evaluated() >= ids_b.len() - first_row,
        "{} of {} positions evaluated: the second image reused the first's",
        sb.n_evaluated(),
        ids_b.len()
    );
    let alone = engine(Some("idefics3-tiny-mmproj")).unwrap();
    let mut fresh = alone.session(Default::default()).unwrap();
    fresh.append_chat_with_images(&ask(), std::slice::from_ref(&b)).unwrap();
    assert_eq!(sb.logits(), fresh.logits(), "the second image's logits as on a fresh engine");
    assert_ne!(sa.logits(), sb.logits(), "the images matter");

    // Both in one conversation: the second takes other ids, each image its own rows.
    let mut both = e.session(Default::default()).unwrap();
    let msg = Message::user(format!("{m}and{m}Describe these.", m = kiln::vision::MEDIA_MARKER));
    let ids = both.append_chat_with_images(&[msg], &[a, b]).unwrap();
    let rows: Vec<u32> = ids.iter().copied().filter(|&t| t >= 0x8000_0000).collect();
    let distinct: std::collections::HashSet<u32> = rows.iter().copied().collect();
    assert_eq!(distinct.len(), rows.len(), "every image row its own id");
}

/// A gemma3 image across a KV block boundary: a new session takes the block holding the
/// image's first rows from the prefix cache and reads the rest of the image alone, as one
/// span that sees the cached rows and itself whole: the logits are those of the first
/// session, which read the image in one step. A follow-up turn evaluates none of it again;
/// a batch too small to hold the image is a clear error.
#[test]
fn gemma3_image_resumed_inside_the_image_gives_the_same_logits() {
    let e = gemma3(Device::Cpu, 512).unwrap();
    let before = "<start_of_turn>user\nHere is a photograph I took last summer on holiday by the sea.\n";
    let after = "What is in it?<end_of_turn>\n<start_of_turn>model\n";
    let run = |s: &mut kiln::Session| {
        s.append_text(before).unwrap();
        let img = s.append_image(&image("alpha.png")).unwrap();
        s.append_text(after).unwrap();
        img
    };
    let mut a = e.session(Default::default()).unwrap();
    let img = run(&mut a);
    let first_row = a.tokens().iter().position(|&t| t >= 0x8000_0000).unwrap();
    let rows = img.iter().filter(|&&t| t >= 0x8000_0000).count();
    assert!(
        first_row < 32 && first_row + rows > 32,
        "the image spans positions 32 ({first_row}, {rows} rows)"
    );
    let mut b = e.session(Default::default()).unwrap();
    run(&mut b);
    assert_eq!(a.tokens(), b.tokens());
    assert!(b.n_evaluated() < a.n_evaluated(), "{} of {} evaluated again", b.n_evaluated(), a.n_evaluated());
    assert_eq!(a.logits(), b.logits(), "the image resumed at position 32 reads as the whole");

    let fresh = gemma3(Device::Cpu, 512).unwrap();
    let mut c = fresh.session(Default::default()).unwrap();
    run(&mut c);
    assert_eq!(a.logits(), c.logits(), "as on a fresh engine");

    let n0 = a.n_evaluated();
    a.append_text("<end_of_turn>\n<start_of_turn>user\nAnd the colors?<end_of_turn>\n").unwrap();
    assert!(a.n_evaluated() - n0 < 20, "the follow-up evaluated {} positions", a.n_evaluated() - n0);
    e.runner().check_kv().unwrap();

    let small = gemma3(Device::Cpu, 8).unwrap();
    let mut s = small.session(Default::default()).unwrap();
    s.append_text(before).unwrap();
    let err = s.append_image(&image("alpha.png")).unwrap_err().to_string();
    assert!(err.contains("read whole") && err.contains("batch size (8)"), "{err}");
}

//! Images in prompts against llama.cpp (`llama-mtmd-cli`'s prompt through libmtmd on the same
//! files; `scripts/gen-vision-fixtures`): SmolLM2-135M with SmolVLM's image tokens added and
//! the tiny synthetic idefics3 encoder. The prompt's layout (text ids around each tile's image
//! rows) equal, the next-token logits within the real model's tolerances, greedy ids equal
//! up to llama.cpp's own near-ties, and another image leads elsewhere. A follow-up turn reuses
//! the image's KV; bad inputs are clear errors.

mod support;

use kiln::chat::Message;
use kiln::gguf::GgufFile;
use kiln::vision::{synth, RgbImage};
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
    let mut opts = EngineOptions::default().with_n_ctx(512).with_threads(2);
    if let Some(p) = mmproj {
        opts = opts.with_mmproj(dir.join(format!("{p}.gguf")));
    }
    Engine::load(dir.join("lm.gguf").to_str().unwrap(), opts)
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

/// kiln's logits against llama.cpp's after the prompt of `stem`: the largest difference and
/// the largest log-probability difference over llama.cpp's top 20.
fn compare_logits(stem: &str, got: &[f32]) -> (f32, f64) {
    let want = floats(&format!("vision/run/{stem}.idefics3-tiny-mmproj.logits.f32"));
    assert_eq!(got.len(), want.len());
    let max_abs = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    let top = kiln::eval::top_k(&want, 20);
    let max_lp = top
        .iter()
        .map(|&(id, _)| (log_softmax_at(got, id as usize) - log_softmax_at(&want, id as usize)).abs())
        .fold(0.0f64, f64::max);
    eprintln!("{stem}: max |Δ logit| {max_abs:.4}, max |Δ logprob| over top 20 {max_lp:.4}");
    (max_abs, max_lp)
}

/// Runs the fixture of `stem` and returns kiln's greedy ids.
fn check(e: &Engine, stem: &str) -> Vec<u32> {
    let fx = fixture_json(&format!("vision/run/{stem}.idefics3-tiny-mmproj.json"));
    let mut s = e.session(Default::default()).unwrap();
    let img = image(fx["image"].as_str().unwrap());
    let ids = s.append_chat_with_images(&[Message::user(fx["prompt"].as_str().unwrap())], &[img]).unwrap();

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

    // The real model's tolerances (tests/oracle_models.rs): the image rows differ from
    // llama.cpp's by the encoder's rounding (vision_encoder.rs), which the language model
    // carries on.
    let (max_abs, max_lp) = compare_logits(stem, s.logits().unwrap());
    assert!(max_lp < 0.5 && max_abs < 0.5, "{stem}: max |Δ logit| {max_abs}, |Δ logprob| {max_lp}");

    // Greedy, a step at a time, up to a near-tie of kiln's.
    let greedy: Vec<u32> =
        fx["greedy"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
    let mut out = Vec::new();
    for &w in &greedy {
        let logits = s.logits().unwrap();
        let best = argmax(logits);
        if best != w {
            let lead = logits[best as usize] - logits[w as usize];
            assert!(
                lead < SMOLLM2.tau(),
                "{stem}: greedy step {}: {best}, llama.cpp {w} (lead {lead})",
                out.len()
            );
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
    assert!(out.len() >= 4, "{stem}: only {} greedy steps compared", out.len());
    out
}

#[test]
fn image_prompts_match_llama_cpp() {
    let e = engine(Some("idefics3-tiny-mmproj")).unwrap();
    let a = check(&e, "test-1.stb");
    let b = check(&e, "alpha");
    assert_ne!(a, b, "the image must matter");
}

/// The language model's side alone: llama.cpp's own image rows (its encoder's output, tiles
/// in the prompt's order: the global image last) placed by kiln where the chunks say give
/// llama.cpp's logits to rounding.
#[test]
fn llama_cpp_image_rows_give_llama_cpp_logits() {
    let e = engine(Some("idefics3-tiny-mmproj")).unwrap();
    let d = e.config().n_embd;
    let stem = "test-1.stb";
    let fx = fixture_json(&format!("vision/run/{stem}.idefics3-tiny-mmproj.json"));
    let mut rows = floats(&format!("vision/embd/{stem}.idefics3-tiny-mmproj.f32"));
    let per_tile = e.vision().unwrap().config().n_tokens_per_image() * d;
    rows.rotate_left(per_tile); // preprocessing order has the global image first
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
    let (max_abs, max_lp) = compare_logits(stem, &logits);
    assert!(max_lp < 0.01 && max_abs < 0.02, "max |Δ logit| {max_abs}, |Δ logprob| {max_lp}");
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

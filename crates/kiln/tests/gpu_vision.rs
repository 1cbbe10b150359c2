//! The vision encoder on the GPU backend (lavapipe in CI) against the CPU backend's: the
//! projected rows of every tile of an image close on both tiny synthetic mmproj families
//! (idefics3: 16 patches a tile, several tiles; gemma3: 64 patches, average pooling and the
//! soft-embedding norm), and an engine on `--device gpu` encoding on the GPU with the same
//! greedy ids after a small image as the CPU's, up to the CPU's first near-tie.
#![cfg(feature = "gpu")]

mod support;
use support::nmse;
use support::top2;

use std::sync::Arc;

use kiln::backend::cpu::CpuBackend;
use kiln::backend::wgpu::{AdapterPolicy, GpuBackend};
use kiln::backend::Backend;
use kiln::chat::Message;
use kiln::engine::Device;
use kiln::gguf::GgufFile;
use kiln::vision::{preprocess, synth, RgbImage, VisionEncoder};
use kiln::{Engine, EngineOptions};
use support::*;

/// The bars on the GPU's rows against the CPU's (normalized squared error, largest absolute
/// difference): the GPU's attention keeps ggml's one-chunk f16 arithmetic where the CPU's
/// takes f32 sums from 64 patches on, and its LayerNorm sums in float-float.
const MAX_NMSE: f64 = 1e-5;
const MAX_ABS: f32 = 1e-2;
/// The CPU's top-2 logit margin under which greedy ids stop being compared.
const TAU: f32 = 0.25;
/// The bar on the logits after the image: gpu_models.rs's on software adapters (here the
/// idefics3 rows are the CPU's bits), and its bar for hardware adapters' vec path.
const LOGITS_NMSE: f64 = 1e-4;
const HW_LOGITS_NMSE: f64 = 2e-2;

fn encoder<B: Backend>(preset: &str, be: B) -> VisionEncoder {
    let bytes = synth::preset(preset).unwrap().build().unwrap().to_bytes();
    let g = Arc::new(GgufFile::from_bytes(bytes).unwrap());
    VisionEncoder::load(g, Arc::new(be)).unwrap()
}

fn image(name: &str) -> RgbImage {
    RgbImage::open(fixtures().join("vision").join(name)).unwrap()
}

#[test]
fn gpu_encoder_matches_cpu() {
    for preset in ["idefics3-tiny-mmproj", "gemma3-tiny-mmproj"] {
        let cpu = encoder(preset, CpuBackend::new(2));
        let gpu = encoder(preset, GpuBackend::new(AdapterPolicy::AnyGpu).unwrap());
        assert!(gpu.backend_name().starts_with("gpu"), "{}", gpu.backend_name());
        let pre = preprocess(&image("test-1.stb.png"), cpu.config()).unwrap();
        for (i, t) in pre.tiles.iter().enumerate() {
            let (c, g) = (cpu.encode(t).unwrap(), gpu.encode(t).unwrap());
            assert_eq!(c.len(), g.len());
            let e = nmse(&g, &c);
            let max = c.iter().zip(&g).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            eprintln!("{preset} tile {i}: nmse {e:.3e}, max abs diff {max:.3e} over {} values", c.len());
            assert!(e < MAX_NMSE && max < MAX_ABS, "{preset} tile {i}: nmse {e:e}, max {max}");
        }
        // The GPU's scratch is kept between tiles: a tile encoded again gives the same rows.
        let again = gpu.encode(&pre.tiles[0]).unwrap();
        assert_eq!(again, gpu.encode(&pre.tiles[0]).unwrap(), "{preset}");
    }
}

/// SmolLM2 with SmolVLM's image tokens on `device`, with the idefics3-tiny mmproj.
fn engine(device: Device) -> Engine {
    engine_with(device, "mmproj.gguf")
}

/// The language model and mmproj files, written once: the idefics3-tiny mmproj, and one of
/// 14-pixel patches (rows of 588 values, which the GPU's matmul does not take).
fn files() -> &'static std::path::Path {
    static DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("kiln-gpu-vision-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let lm = GgufFile::open(model(SMOLLM2.name)).unwrap();
        let with_tokens = synth::with_added_tokens(&lm, &synth::smolvlm_image_tokens()).unwrap();
        with_tokens.write_file(dir.join("lm.gguf")).unwrap();
        let spec = synth::preset("idefics3-tiny-mmproj").unwrap();
        spec.build().unwrap().write_file(dir.join("mmproj.gguf")).unwrap();
        let p14 = synth::MmprojSpec { patch_size: 14, image_size: 56, longest_edge: 112, ..spec };
        p14.build().unwrap().write_file(dir.join("mmproj-p14.gguf")).unwrap();
        dir
    })
}

/// The CPU engine's encoder in tinyBLAS's order (no AMX tiles), whose bits the GPU's
/// kernels give on software adapters.
fn engine_with(device: Device, mmproj: &str) -> Engine {
    let dir = files();
    let opts = EngineOptions::default().with_n_ctx(256).with_threads(2).with_device(device);
    let opts = opts.with_encoder_amx(false);
    let opts = opts.with_mmproj(dir.join(mmproj));
    Engine::load(dir.join("lm.gguf").to_str().unwrap(), opts).unwrap()
}

#[test]
fn gpu_engine_encodes_images_on_the_gpu_with_the_cpus_greedy_ids() {
    let (cpu, gpu) = (engine(Device::Cpu), engine(Device::Gpu));
    let name = gpu.vision().unwrap().backend_name();
    assert!(name.starts_with("gpu"), "the GPU engine's encoder runs on {name}");
    assert!(cpu.vision().unwrap().backend_name().starts_with("cpu"));
    let img = image("tiny.png");
    let msgs = [Message::user("Describe this image.")];
    let (mut sc, mut sg) =
        (cpu.session(Default::default()).unwrap(), gpu.session(Default::default()).unwrap());
    let ids = sc.append_chat_with_images(&msgs, std::slice::from_ref(&img)).unwrap();
    assert_eq!(ids, sg.append_chat_with_images(&msgs, &[img]).unwrap());
    let software = GpuBackend::new(AdapterPolicy::AnyGpu).unwrap().is_software();
    let max_nmse = if software { LOGITS_NMSE } else { HW_LOGITS_NMSE };
    let mut same = 0;
    for step in 0..8 {
        let (lc, lg) = (sc.logits().unwrap().to_vec(), sg.logits().unwrap().to_vec());
        let e = nmse(&lg, &lc);
        assert!(e < max_nmse, "step {step}: logits NMSE {e:e}");
        let ((tc, margin), (tg, _)) = (top2(&lc), top2(&lg));
        if margin < TAU {
            eprintln!("CPU near-tie at step {step} (margin {margin}): stop comparing ids");
            break;
        }
        assert_eq!(tg, tc, "step {step}: GPU argmax {tg}, CPU {tc} (margin {margin})");
        same += 1;
        sc.append_tokens(&[tc]).unwrap();
        sg.append_tokens(&[tc]).unwrap();
    }
    eprintln!("{} prompt positions ({} of them image rows), {same} greedy steps equal", ids.len(), {
        let n_vocab = cpu.config().n_vocab as u32;
        ids.iter().filter(|&&id| id >= n_vocab).count()
    });
    assert!(same >= 4, "only {same} greedy steps compared");
}

/// An encoder whose matrices the GPU's kernels do not take (14-pixel patches: rows of 588
/// values) runs on the CPU under `--device gpu`, and still encodes.
#[test]
fn an_encoder_the_gpu_cannot_take_runs_on_the_cpu() {
    let e = engine_with(Device::Gpu, "mmproj-p14.gguf");
    let name = e.vision().unwrap().backend_name();
    assert!(name.starts_with("cpu"), "{name}");
    let mut s = e.session(Default::default()).unwrap();
    s.append_chat_with_images(&[Message::user("Describe this image.")], &[image("tiny.png")]).unwrap();
    assert!(s.logits().unwrap().iter().all(|x| x.is_finite()));
}

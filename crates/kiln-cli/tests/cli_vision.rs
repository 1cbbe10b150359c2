//! `kiln run --mmproj --image` per docs/cli.md: the prompt llama-mtmd-cli forms (the text ids
//! of tests/fixtures/vision/run/), greedy ids as llama.cpp's up to its near-tie, and clear
//! errors for images the command cannot take.

mod support;

use std::process::Output;
use std::sync::OnceLock;

use kiln::vision::synth;
use serde_json::Value as Json;
use support::{fails, fixture, kiln};

/// SmolLM2 with SmolVLM's image tokens and the idefics3-tiny mmproj, written once.
fn files() -> &'static (String, String) {
    static F: OnceLock<(String, String)> = OnceLock::new();
    F.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("kiln-cli-vision-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = kiln::hub::resolve_model("smollm2-135m").unwrap();
        let lm = kiln::gguf::GgufFile::open(src).unwrap();
        let (l, m) = (dir.join("lm.gguf"), dir.join("mmproj.gguf"));
        synth::with_added_tokens(&lm, &synth::smolvlm_image_tokens()).unwrap().write_file(&l).unwrap();
        synth::preset("idefics3-tiny-mmproj").unwrap().build().unwrap().write_file(&m).unwrap();
        (l.to_str().unwrap().to_string(), m.to_str().unwrap().to_string())
    })
}

/// `kiln run -m LM --mmproj MMPROJ --image IMAGE ARGS...`, the encoder in tinyBLAS's order
/// (`KILN_CPU=avx512vnni`: no AMX tiles; every tier gives the language model the same bits):
/// llama.cpp's first greedy step here is one of its near-ties (top-2 margin 0.12), which the
/// AMX tiles' rounding of the image rows can flip.
fn run_image(lm: &str, mmproj: &str, image: &str, args: &[&str]) -> Output {
    let args = [&["run", "-m", lm, "--mmproj", mmproj, "--image", image], args].concat();
    std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .env("KILN_CPU", "avx512vnni")
        .output()
        .unwrap()
}

#[test]
fn run_with_an_image_matches_llama_mtmd_cli() {
    let (lm, mmproj) = files();
    let fx: Json = serde_json::from_str(
        &std::fs::read_to_string(fixture("vision/run/test-1.stb.idefics3-tiny-mmproj.json")).unwrap(),
    )
    .unwrap();
    let img = fixture("vision/test-1.stb.png");
    let args = ["--temp", "0", "-n", "8", "-t", "2", "--json", "Describe this image."];
    let out = run_image(lm, mmproj, img.to_str().unwrap(), &args);
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let j: Json = serde_json::from_slice(&out.stdout).unwrap();
    let text_ids =
        |ids: &[Json]| -> Vec<u64> { ids.iter().filter_map(Json::as_u64).filter(|&t| t < 1 << 31).collect() };
    let want: Vec<u64> = fx["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c.get("text"))
        .flat_map(|t| t.as_array().unwrap().iter().map(|x| x.as_u64().unwrap()))
        .collect();
    let prompt = j["prompt_ids"].as_array().unwrap();
    assert_eq!(text_ids(prompt), want, "the prompt's text ids");
    let n_rows: u64 = fx["chunks"].as_array().unwrap().iter().filter_map(|c| c["image"].as_u64()).sum();
    assert_eq!(prompt.len() as u64, want.len() as u64 + n_rows);
    // llama.cpp's greedy ids up to step 7, a near-tie there (crates/kiln/tests/vision_prompt.rs).
    assert_eq!(j["ids"].as_array().unwrap()[..4], fx["greedy"].as_array().unwrap()[..4]);
}

#[test]
fn images_the_command_cannot_take_are_errors() {
    let (lm, mmproj) = files();
    let img = fixture("vision/tiny.png");
    let img = img.to_str().unwrap();
    fails(&kiln(&["run", "-m", lm, "--image", img, "-n", "1", "hi"]), "takes no images");
    let not_image = fixture("vision/preprocess.json");
    let not_image = not_image.to_str().unwrap();
    fails(&run_image(lm, mmproj, not_image, &["-n", "1", "hi"]), "not a readable image");
    fails(&run_image(lm, mmproj, "/nonexistent.png", &["-n", "1", "hi"]), "nonexistent");
    fails(&kiln(&["run", "-m", lm, "--mmproj", lm, "-n", "1", "hi"]), "not an mmproj file");
}

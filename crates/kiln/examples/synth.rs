//! Writes a synthetic model or mmproj file: `cargo run --release --example synth -- PRESET
//! OUT.gguf`. Presets are listed by running it with no arguments; `smollm2-image-tokens:PATH`
//! writes the language model at PATH with SmolVLM's image tokens added.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [preset, out] = args.as_slice() else {
        eprintln!(
            "usage: synth PRESET OUT.gguf\npresets: {}, {}",
            kiln::model::synth::PRESETS.join(", "),
            kiln::vision::synth::PRESETS.join(", ")
        );
        std::process::exit(2);
    };
    let built = if let Some(src) = preset.strip_prefix("smollm2-image-tokens:") {
        // SmolLM2 with SmolVLM's image tokens: the language model of the idefics3 fixtures.
        kiln::gguf::GgufFile::open(src).and_then(|g| {
            kiln::vision::synth::with_added_tokens(&g, &kiln::vision::synth::smolvlm_image_tokens())
        })
    } else if let Some(spec) = kiln::model::synth::preset(preset) {
        spec.build()
    } else if let Some(spec) = kiln::vision::synth::preset(preset) {
        spec.build()
    } else {
        eprintln!("error: unknown preset {preset}");
        std::process::exit(2);
    };
    if let Err(e) = built.and_then(|w| w.write_file(out)) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

//! Writes a synthetic model: `cargo run --release --example synth -- PRESET OUT.gguf`.
//! Presets are listed by running it with no arguments.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [preset, out] = args.as_slice() else {
        eprintln!("usage: synth PRESET OUT.gguf\npresets: {}", kiln::model::synth::PRESETS.join(", "));
        std::process::exit(2);
    };
    let Some(spec) = kiln::model::synth::preset(preset) else {
        eprintln!("error: unknown preset {preset}");
        std::process::exit(2);
    };
    if let Err(e) = spec.build().and_then(|w| w.write_file(out)) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

//! Cosine similarities of mean-pooled, normalized embeddings:
//! `cargo run --release --example embed_similarity -- [MODEL] TEXT TEXT...`.

use kiln::embed::{normalize, Pooling};
use kiln::{Engine, EngineOptions};

fn main() -> kiln::Result<()> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let model = if args.first().is_some_and(|a| a.ends_with(".gguf")) {
        args.remove(0)
    } else {
        kiln::hub::DEFAULT_MODEL.to_string()
    };
    if args.len() < 2 {
        args = vec![
            "A cat sat on the mat.".into(),
            "A kitten rested on a rug.".into(),
            "Stock prices fell.".into(),
        ];
    }
    let engine = Engine::load(&model, EngineOptions::default())?;
    let mut vecs = Vec::new();
    for t in &args {
        let mut v = engine.embed(t, Pooling::Mean)?.remove(0);
        normalize(&mut v);
        vecs.push(v);
    }
    for i in 0..args.len() {
        for j in i + 1..args.len() {
            let cos: f32 = vecs[i].iter().zip(&vecs[j]).map(|(a, b)| a * b).sum();
            println!("{cos:.4}  {:?} ~ {:?}", args[i], args[j]);
        }
    }
    Ok(())
}

//! Runs token ids through a model and prints the argmax and top logits (a debugging aid).
use kiln::backend::cpu::CpuBackend;
use kiln::model::{Entry, Model, ModelRunner, OutputKind, Runner};
use std::sync::Arc;

fn main() -> kiln::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let g = Arc::new(kiln::gguf::GgufFile::open(&args[1])?);
    let ids: Vec<u32> = args[2].split(',').map(|s| s.trim().parse().unwrap()).collect();
    let model = Model::load(&g, CpuBackend::new(2))?;
    println!("{:?}", model.cfg);
    let r = ModelRunner::new(model, 512, 512)?;
    let seq = r.new_seq();
    let e: Vec<Entry> =
        ids.iter().enumerate().map(|(i, &t)| Entry { seq, token: t, output: i + 1 == ids.len() }).collect();
    let l = r.decode(&e, OutputKind::Logits)?;
    let mut idx: Vec<usize> = (0..l.len()).collect();
    idx.sort_by(|&a, &b| l[b].total_cmp(&l[a]));
    for &i in &idx[..5] {
        println!("{i} {}", l[i]);
    }
    Ok(())
}

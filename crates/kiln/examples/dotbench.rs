use kiln::quant::{self, GgmlType};
use std::time::Instant;
fn main() {
    for (ty, k, rows) in [
        (GgmlType::Q4_1, 576usize, 20000usize),
        (GgmlType::Q8_0, 576, 20000),
        (GgmlType::Q4_K, 1536, 8000),
        (GgmlType::Q6_K, 1536, 8000),
    ] {
        let vdt = ty.vec_dot_type();
        let x: Vec<f32> = (0..k * rows).map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 300.0).collect();
        let rs = ty.row_size(k).unwrap();
        let mut w = vec![0u8; rs * rows];
        for r in 0..rows {
            quant::quantize_row(ty, &x[r * k..(r + 1) * k], &mut w[r * rs..(r + 1) * rs]).unwrap();
        }
        let ars = vdt.row_size(k).unwrap();
        let mut a = vec![0u8; ars];
        quant::quantize_activation(vdt, &x[..k], &mut a).unwrap();
        let dot = quant::vec_dot_fn(ty);
        let mut s = 0.0;
        let t = Instant::now();
        let reps = 20;
        for _ in 0..reps {
            for r in 0..rows {
                s += dot(&w[r * rs..(r + 1) * rs], &a, k);
            }
        }
        let el = t.elapsed().as_secs_f64();
        let blocks = (reps * rows * k / 32) as f64;
        println!(
            "{:?}: {:.2} ns/32 weights, {:.2} GB/s (w in L2/L3: {} KB) {}",
            ty,
            el * 1e9 / blocks,
            (reps * rows * rs) as f64 / el / 1e9,
            rs * rows / 1024,
            s
        );
    }
}

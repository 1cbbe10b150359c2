//! `kiln run`: generate a reply to one prompt, streamed to stdout.

use std::ops::ControlFlow;

use kiln::chat::Message;
use kiln::sample::SamplerParams;
use kiln::session::{GenerateOptions, Session};
use kiln::vision::{RgbImage, MEDIA_MARKER};
use kiln::KilnError;
use serde_json::json;

use super::common::{print_out, ModelArgs, SpecArgs, TextArgs};
use super::grammar::{self, GrammarArgs};
use super::prompt::prompt_ids;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    text: TextArgs,
    /// Tokens to generate at most (-1: until end of generation or the context).
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_hyphen_values = true)]
    n_predict: i64,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    grammar: GrammarArgs,
    #[command(flatten)]
    spec: SpecArgs,
    /// System message (chat mode).
    #[arg(long)]
    system: Option<String>,
    /// Use the prompt as plain text, without the chat template.
    #[arg(long)]
    raw: bool,
    /// An image for the prompt (needs --mmproj); repeatable. It goes where the prompt says
    /// <__media__>, else before the text.
    #[arg(long, value_name = "FILE")]
    image: Vec<String>,
    #[arg(long)]
    json: bool,
}

/// Sampling flags, llama.cpp's names and defaults.
#[derive(clap::Args, Clone, Debug)]
pub struct SamplingArgs {
    #[arg(long, default_value_t = 0.8, allow_hyphen_values = true)]
    temp: f32,
    #[arg(long = "top-k", default_value_t = 40, allow_hyphen_values = true)]
    top_k: i32,
    #[arg(long = "top-p", default_value_t = 0.95)]
    top_p: f32,
    #[arg(long = "min-p", default_value_t = 0.05)]
    min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    typical: f32,
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    repeat_penalty: f32,
    #[arg(long = "repeat-last-n", default_value_t = 64, allow_hyphen_values = true)]
    repeat_last_n: i32,
    #[arg(long = "presence-penalty", default_value_t = 0.0, allow_hyphen_values = true)]
    presence_penalty: f32,
    #[arg(long = "frequency-penalty", default_value_t = 0.0, allow_hyphen_values = true)]
    frequency_penalty: f32,
    /// TOKEN_ID(+|-)BIAS, e.g. 15043+1 or 2-inf; repeatable.
    #[arg(long = "logit-bias", allow_hyphen_values = true)]
    logit_bias: Vec<String>,
    #[arg(long)]
    seed: Option<u64>,
    /// Stop before this string; repeatable.
    #[arg(long)]
    stop: Vec<String>,
    #[arg(long = "ignore-eos")]
    ignore_eos: bool,
}

impl SamplingArgs {
    pub fn params(&self) -> kiln::Result<SamplerParams> {
        let mut bias = Vec::new();
        for b in &self.logit_bias {
            bias.push(parse_bias(b)?);
        }
        let mut p = SamplerParams::default();
        p.temp = self.temp;
        p.top_k = self.top_k;
        p.top_p = self.top_p;
        p.min_p = self.min_p;
        p.typical_p = self.typical;
        p.repeat_penalty = self.repeat_penalty;
        p.repeat_last_n = self.repeat_last_n;
        p.presence_penalty = self.presence_penalty;
        p.frequency_penalty = self.frequency_penalty;
        p.logit_bias = bias;
        p.seed = self.seed;
        Ok(p)
    }
}

fn parse_bias(s: &str) -> kiln::Result<(u32, f32)> {
    let bad = || KilnError::invalid(format!("--logit-bias {s:?}: expected TOKEN_ID(+|-)BIAS"));
    let at = s.char_indices().skip(1).find(|&(_, c)| c == '+' || c == '-').map(|(i, _)| i).ok_or_else(bad)?;
    let id: u32 = s[..at].parse().map_err(|_| bad())?;
    let sign = if &s[at..at + 1] == "-" { -1.0 } else { 1.0 };
    let mag: f32 = s[at + 1..].parse().map_err(|_| bad())?;
    Ok((id, sign * mag))
}

/// The prompt with images placed as `llama-mtmd-cli -p PROMPT --image IMG` places them: at
/// each media marker, else before the text; in chat mode inside the user message.
fn prompt_with_images(
    s: &mut Session,
    prompt: &str,
    images: &[RgbImage],
    system: Option<&str>,
    raw: bool,
) -> kiln::Result<Vec<u32>> {
    if s.engine().chat_template().is_some() && !raw {
        let mut msgs: Vec<Message> = system.map(Message::system).into_iter().collect();
        msgs.push(Message::user(prompt));
        return s.append_chat_with_images(&msgs, images);
    }
    let text = if prompt.contains(MEDIA_MARKER) {
        prompt.to_string()
    } else {
        MEDIA_MARKER.repeat(images.len()) + prompt
    };
    let segments: Vec<&str> = text.split(MEDIA_MARKER).collect();
    if segments.len() - 1 != images.len() {
        return Err(KilnError::invalid(format!(
            "{} image markers in the prompt for {} images",
            segments.len() - 1,
            images.len()
        )));
    }
    for (i, seg) in segments.iter().enumerate() {
        if !seg.is_empty() {
            s.append_text(seg)?;
        }
        if let Some(img) = images.get(i) {
            s.append_image(img)?;
        }
    }
    Ok(s.tokens())
}

pub fn run(a: Args) -> kiln::Result<()> {
    let prompt = a.text.require()?;
    let params = a.sampling.params()?;
    let grammar = a.grammar.grammar()?;
    let images = a.image.iter().map(RgbImage::open).collect::<kiln::Result<Vec<_>>>()?;
    let engine = a.model.load_with(a.spec.options())?;
    params.validate(engine.config().n_vocab)?;
    grammar::check(&engine, &grammar)?;
    let mut session = engine.session(super::common::session_options())?;
    let appended = if images.is_empty() {
        prompt_ids(&engine, &prompt, a.system.as_deref(), a.raw)
            .and_then(|ids| session.append_tokens(&ids).map(|_| ids))
    } else {
        prompt_with_images(&mut session, &prompt, &images, a.system.as_deref(), a.raw)
    };
    crate::bars::clear();
    let ids = appended?;
    let mut opts = GenerateOptions::default()
        .with_sampler(params)
        .with_stop(a.sampling.stop.clone())
        .with_ignore_eos(a.sampling.ignore_eos);
    if a.n_predict >= 0 {
        opts = opts.with_max_tokens(a.n_predict as usize);
    }
    if let Some(g) = grammar {
        opts = opts.with_grammar(g);
    }
    let stream = !a.json;
    let summary = session.generate(&opts, |ev| {
        if stream && !ev.text.is_empty() {
            print_out(ev.text);
        }
        ControlFlow::Continue(())
    })?;
    let t = &summary.timings;
    let rate = |n: usize, ms: f64| if ms > 0.0 { n as f64 * 1e3 / ms } else { 0.0 };
    if a.json {
        let out = json!({
            "prompt_ids": ids, "ids": summary.ids, "text": summary.text,
            "finish_reason": summary.finish_reason.as_str(),
            "timings": {"load_ms": engine.load_ms(), "prompt_n": t.prompt_n, "prompt_ms": t.prompt_ms,
                        "prompt_tok_s": rate(t.prompt_n, t.prompt_ms), "gen_n": t.gen_n, "gen_ms": t.gen_ms,
                        "gen_tok_s": rate(t.gen_n, t.gen_ms), "image_n": t.image_n, "image_ms": t.image_ms,
                        "draft_tokens": t.draft_tokens, "accepted_tokens": t.accepted_tokens},
        });
        print_out(&format!("{out}\n"));
    } else {
        if std::io::IsTerminal::is_terminal(&std::io::stdout()) {
            print_out("\n");
        }
        eprintln!(
            "kiln: prompt {} tok at {:.1} tok/s, generated {} tok at {:.1} tok/s ({})",
            t.prompt_n,
            rate(t.prompt_n, t.prompt_ms),
            t.gen_n,
            rate(t.gen_n, t.gen_ms),
            summary.finish_reason.as_str()
        );
        if t.draft_tokens > 0 {
            eprintln!(
                "kiln: drafted {} tok, accepted {} ({:.0}%)",
                t.draft_tokens,
                t.accepted_tokens,
                100.0 * t.accepted_tokens as f64 / t.draft_tokens as f64
            );
        }
    }
    Ok(())
}

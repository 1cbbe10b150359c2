//! The grammar module without a model: compiling each kind of grammar, matching strings,
//! errors on bad input, and the constraint's sampling loop (triggers, completion, EOS) over
//! a vocabulary of single bytes with random logits.

use std::sync::Arc;

use kiln::grammar::{CompiledGrammar, Constraint, Grammar, GrammarEnv, GrammarSpec, Trigger};
use kiln::sample::{Sampler, SamplerParams};
use kiln::KilnError;

/// Tokens 0..=255 are the bytes; 256 `<eos>` (end of generation), 257 `<|tool|>`, 258
/// `<|x|>` (special); 259.. a few multi-byte tokens.
const EOS: u32 = 256;
const TOOL: u32 = 257;

fn env() -> Arc<GrammarEnv> {
    let mut words: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    words.push(b"\xff<eos>".to_vec());
    words.push(b"\xff<|tool|>".to_vec());
    words.push(b"\xff<|x|>".to_vec());
    for w in ["{\"", "\":", "true", "false", "  ", "\n\n\n", "abc", "<tool_call>"] {
        words.push(w.as_bytes().to_vec());
    }
    Arc::new(GrammarEnv::from_vocab(words, &[EOS]).unwrap())
}

fn compile(g: Grammar) -> CompiledGrammar {
    env().compile(&g.into()).unwrap_or_else(|e| panic!("{e}"))
}

fn err(g: Grammar) -> String {
    match env().compile(&g.into()) {
        Err(KilnError::Grammar(m)) => m,
        Err(e) => panic!("not a grammar error: {e}"),
        Ok(_) => panic!("compiled"),
    }
}

#[test]
fn each_kind_compiles_and_matches() {
    let g = compile(Grammar::Gbnf("root ::= (\"ab\" | [0-9]+) \"!\"".into()));
    assert!(g.matches("ab!") && g.matches("42!"));
    assert!(!g.matches("ab") && !g.matches("a!") && !g.matches("ab!!"));

    let g = compile(Grammar::Regex("[a-c]{2}x?".into()));
    assert!(g.matches("ab") && g.matches("cax") && !g.matches("abc"));

    let g = compile(Grammar::Lark("start: \"x\" NUM\nNUM: /[0-9]+/".into()));
    assert!(g.matches("x12") && !g.matches("x"));

    let g = compile(Grammar::JsonObject);
    assert!(g.matches(r#"{"a": [1, 2, {"b": null}]}"#) && g.matches("{}"));
    assert!(!g.matches("[]") && !g.matches("1") && !g.matches(" {}") && !g.matches("{} "));

    let schema = Grammar::json_schema_str(
        r#"{"type":"object","properties":{"n":{"type":"integer","minimum":1},"s":{"enum":["a","b"]}},
            "required":["n","s"],"additionalProperties":false}"#,
    )
    .unwrap();
    let g = compile(schema);
    assert!(g.matches(r#"{"n":3,"s":"a"}"#));
    assert!(g.matches("{\n  \"n\": 3,\n  \"s\": \"b\"\n}"));
    assert!(!g.matches(r#"{"n":0,"s":"a"}"#) && !g.matches(r#"{"n":3}"#) && !g.matches(r#"{"n":3,"s":"c"}"#));
}

#[test]
fn json_whitespace_is_bounded() {
    let g = compile(Grammar::JsonObject);
    assert!(g.matches("{ \"a\": 1 }") && g.matches("{\n\n\t\"a\":1}"));
    // Three newlines, or two blanks, at one place: never endless padding.
    assert!(!g.matches("{\n\n\n\"a\":1}") && !g.matches("{  \"a\":1}"));
}

#[test]
fn gbnf_is_read_as_characters() {
    // llguidance alone would lex "ab" greedily here; GBNF has no lexer.
    let g = compile(Grammar::Gbnf(r#"root ::= ("a" | "ab") "bc""#.into()));
    assert!(g.matches("abc") && g.matches("abbc"));
    let g = compile(Grammar::Gbnf("root ::= word \"x\"\nword ::= [a-z]+".into()));
    assert!(g.matches("abcx") && g.matches("xx") && !g.matches("abc"));
    // A regular grammar becomes one regular expression, matched exactly.
    let g = compile(Grammar::Gbnf("root ::= [a-z]+ \"x\" | \"\"".into()));
    assert!(g.matches("abcx") && g.matches("") && !g.matches("abc"));
}

#[test]
fn gbnf_tokens() {
    let g = compile(Grammar::Gbnf("root ::= <[257]> (!<[258]>)* <|x|>".into()));
    assert!(g.matches_tokens(&[TOOL, b'a' as u32, b'b' as u32, 258]));
    assert!(g.matches_tokens(&[TOOL, 258]));
    assert!(!g.matches_tokens(&[b'a' as u32, 258]));
    assert!(!g.matches("<|tool|><|x|>"), "a special token's text is not the token");
}

#[test]
fn errors_name_the_problem() {
    let e = err(Grammar::Gbnf("root ::= \"a\"\nfoo ::= bar (\n".into()));
    assert!(e.contains("line 3, column 1: expected `)`"), "{e}");
    let e = err(Grammar::Gbnf("root ::= expr\nexpr ::= \"a\" numero\n".into()));
    assert!(e.contains("undefined rule `numero`") && e.contains("line 2, column 14"), "{e}");
    let e = err(Grammar::Gbnf("rot ::= \"a\"".into()));
    assert!(e.contains("no `root` rule"), "{e}");
    let e = err(Grammar::Gbnf("root ::= \"\\q\"".into()));
    assert!(e.contains("unknown escape") && e.contains("column 11"), "{e}");
    let e = err(Grammar::Gbnf("root ::= <[9999]>".into()));
    assert!(e.contains("outside the vocabulary"), "{e}");
    let e = err(Grammar::Gbnf("root ::= \"a\"{3000}".into()));
    assert!(e.contains("2000"), "{e}");
    let e = err(Grammar::Gbnf(format!("root ::= {}\"a\"{}", "(".repeat(500), ")".repeat(500))));
    assert!(e.contains("nested too deeply"), "{e}");
    let e = err(Grammar::Regex("(a".into()));
    assert!(e.starts_with("regex"), "{e}");
    let e = err(Grammar::json_schema_str(r#"{"type":"array","minContains":2}"#).unwrap());
    assert!(e.contains("minContains"), "{e}");
    let e = err(Grammar::json_schema_str(r#"{"type":"kaboom"}"#).unwrap());
    assert!(e.contains("kaboom"), "{e}");
    let e = err(Grammar::json_schema_str(r#"{"type":"string","format":"bogus"}"#).unwrap());
    assert!(e.contains("bogus"), "{e}");
    assert!(Grammar::json_schema_str("{nope").is_err());
    let e = err(Grammar::JsonSchema(serde_json::json!(3)));
    assert!(e.contains("not a number"), "{e}");
    let e = err(Grammar::Lark("start: undefined_rule".into()));
    assert!(e.contains("undefined_rule"), "{e}");
}

/// Random logits over the vocabulary (a simple LCG, so failures reproduce).
fn logits(seed: &mut u64, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 8.0
        })
        .collect()
}

/// Samples until end of generation or `max` tokens; returns the tokens.
fn run(c: &mut Constraint, sampler: &mut Sampler, seed: &mut u64, max: usize) -> Vec<u32> {
    let n = env().n_vocab();
    let mut out = Vec::new();
    for _ in 0..max {
        let id = c.sample(sampler, &logits(seed, n)).unwrap();
        sampler.accept(id);
        c.accept(id).unwrap();
        out.push(id);
        if id == EOS || c.is_complete() {
            break;
        }
    }
    out
}

#[test]
fn sampled_outputs_match() {
    let env = env();
    let grammars = [
        Grammar::Gbnf("root ::= \"<\" [a-c]* (\"!\" | \"?\")+ \">\"".into()),
        Grammar::JsonSchema(
            serde_json::json!({"type":"object","properties":{"a":{"type":"boolean"}},"required":["a"]}),
        ),
        Grammar::Regex("(yes|no)[0-9]{1,3}".into()),
    ];
    for g in grammars {
        let compiled = env.compile(&g.clone().into()).unwrap();
        let mut seed = 7;
        let mut n_complete = 0;
        for round in 0..40 {
            let mut c = compiled.constraint();
            let params =
                SamplerParams::default().with_seed(round).with_top_k(0).with_min_p(0.0).with_temp(1.5);
            let mut sampler = Sampler::new(params, env.n_vocab()).unwrap();
            let mut ids = run(&mut c, &mut sampler, &mut seed, 200);
            if ids.last() == Some(&EOS) {
                ids.pop();
            } else if !c.is_complete() {
                continue; // cut by the length limit
            }
            n_complete += 1;
            assert!(compiled.matches_tokens(&ids), "{g:?}: {ids:?}");
        }
        assert!(n_complete >= 10, "{g:?}: only {n_complete} complete outputs");
    }
}

/// Greedy under a grammar checks the raw logits' argmax alone and computes the mask only
/// when it is refused; step by step it picks what masking first and running the whole
/// chain over the masked logits picks (a bias of zero keeps that sampler off the argmax
/// shortcut), over logits with frequent ties, infinities and NaNs.
#[test]
fn greedy_check_first_equals_the_masked_chain() {
    let env = env();
    let n = env.n_vocab();
    let grammars = [
        Grammar::JsonSchema(serde_json::json!({"type":"object","properties":{
            "a":{"type":"boolean"},"b":{"type":"array","items":{"type":"string"}}},"required":["a","b"]})),
        Grammar::JsonObject,
        Grammar::Gbnf("root ::= \"<\" [a-c]* (\"!\" | \"?\")+ \">\"".into()),
        Grammar::Regex("(yes|no)[0-9]{1,3}".into()),
    ];
    let special = [f32::INFINITY, f32::NEG_INFINITY, f32::NAN, -f32::NAN];
    let mut seed = 11;
    let (mut n_masked, mut n_sampled) = (0, 0);
    for g in grammars {
        let check_first = env.compile(&g.clone().into()).unwrap();
        let mask_first = env.compile(&GrammarSpec::from(g.clone()).with_mask_first(true)).unwrap();
        for round in 0..30 {
            let mut fast = check_first.constraint();
            let mut full = mask_first.constraint();
            let mut plain = Sampler::new(SamplerParams::greedy(), n).unwrap();
            let mut chain = Sampler::new(SamplerParams::greedy().with_bias(0, 0.0), n).unwrap();
            for step in 0..100 {
                // Nine distinct values, so ties are common; now and then an extreme value,
                // and every seventh round's first step all equal.
                let mut l: Vec<f32> = logits(&mut seed, n).iter().map(|v| v.round()).collect();
                if round % 7 == 0 && step == 0 {
                    l.fill(0.0);
                }
                if step % 5 == 0 {
                    let i = (seed >> 33) as usize % n;
                    l[i] = special[(seed >> 50) as usize % special.len()];
                }
                let a = fast.sample(&mut plain, &l).unwrap();
                let b = full.sample(&mut chain, &l).unwrap();
                assert_eq!(a, b, "{g:?} round {round} step {step}");
                fast.accept(a).unwrap();
                full.accept(b).unwrap();
                if a == EOS || fast.is_complete() {
                    break;
                }
            }
            assert_eq!(full.stats().n_masked, full.stats().n_sampled);
            n_masked += fast.stats().n_masked;
            n_sampled += fast.stats().n_sampled;
        }
    }
    // Both ways of the check-first path ran, many times: argmax allowed, argmax refused.
    assert!(100 < n_masked && n_masked + 100 < n_sampled, "{n_masked} masks of {n_sampled}");
}

#[test]
fn eos_exactly_where_complete() {
    let env = env();
    let g = env.compile(&Grammar::Gbnf("root ::= \"a\"+".into()).into()).unwrap();
    let mut c = g.constraint();
    let mut greedy = Sampler::new(SamplerParams::greedy(), env.n_vocab()).unwrap();
    let mut favour_eos = vec![0.0; env.n_vocab()];
    favour_eos[EOS as usize] = 10.0;
    // Not complete yet: EOS is refused, the best allowed token is taken.
    assert_eq!(c.sample(&mut greedy, &favour_eos).unwrap(), b'a' as u32);
    c.accept(b'a' as u32).unwrap();
    assert_eq!(c.sample(&mut greedy, &favour_eos).unwrap(), EOS);

    // A grammar that cannot continue is complete after its last token.
    let g = env.compile(&Grammar::Gbnf("root ::= \"ab\"".into()).into()).unwrap();
    let mut c = g.constraint();
    c.accept(b'a' as u32).unwrap();
    assert!(!c.is_complete());
    c.accept(b'b' as u32).unwrap();
    assert!(c.is_complete());
    assert_eq!(c.sample(&mut greedy, &vec![0.0; env.n_vocab()]).unwrap(), EOS);
    // A refused token is an error.
    let mut c = g.constraint();
    assert!(c.accept(b'x' as u32).is_err());
}

fn lazy(g: &str, triggers: Vec<Trigger>) -> Constraint {
    let spec: GrammarSpec = Grammar::Gbnf(g.into()).lazy(triggers);
    env().compile(&spec).unwrap().constraint()
}

fn feed(c: &mut Constraint, text: &[u32]) -> kiln::Result<()> {
    text.iter().try_for_each(|&t| c.accept(t))
}

fn bytes(s: &str) -> Vec<u32> {
    s.bytes().map(u32::from).collect()
}

#[test]
fn lazy_triggers() {
    // A token trigger: free text, then the grammar from the trigger token on.
    let mut c = lazy("root ::= <[257]> \"{\" [0-9]+ \"}\"", vec![Trigger::Token(TOOL)]);
    feed(&mut c, &bytes("any text, even }{")).unwrap();
    assert!(!c.is_active() && c.activated_at().is_none());
    c.accept(TOOL).unwrap();
    assert!(c.is_active() && c.activated_at() == Some(17));
    feed(&mut c, &bytes("{12")).unwrap();
    assert!(c.accept(b'x' as u32).is_err());

    // A text trigger starting mid-token: the grammar gets the output from the trigger on.
    let abc = 259 + 6;
    let mut c = lazy("root ::= \"bc\" [0-9]* \";\"", vec![Trigger::Text("bc".into())]);
    feed(&mut c, &bytes("xx")).unwrap();
    c.accept(abc).unwrap(); // "abc": the trigger starts at its second byte
    assert!(c.is_active() && c.activated_at() == Some(2));
    feed(&mut c, &bytes("42;")).unwrap();
    assert!(c.is_complete());

    // A pattern with a group: the grammar starts at the group.
    let mut c = lazy("root ::= \"{\" [a-z]* \"}\"", vec![Trigger::Pattern(r"call:\s*(\{)".into())]);
    feed(&mut c, &bytes("call: {ab")).unwrap();
    assert!(c.is_active());
    feed(&mut c, &bytes("c}")).unwrap();
    assert!(c.is_complete());

    // Text after the trigger that the grammar refuses is an error.
    let mut c = lazy("root ::= \"<tool_call>\" \"{\"", vec![Trigger::Text("<tool_call>".into())]);
    assert!(feed(&mut c, &bytes("<tool_call>x")).is_err());

    // Bad triggers are compile errors.
    let spec = Grammar::Gbnf("root ::= \"a\"".into()).lazy(vec![Trigger::Pattern("(".into())]);
    assert!(env().compile(&spec).is_err());
    let spec = Grammar::Gbnf("root ::= \"a\"".into()).lazy(vec![Trigger::Token(100_000)]);
    assert!(env().compile(&spec).is_err());
}

#[test]
fn unconstrained_until_triggered() {
    let env = env();
    let spec = Grammar::Gbnf("root ::= <[257]> \"ok\"".into()).lazy(vec![Trigger::Token(TOOL)]);
    let mut c = env.compile(&spec).unwrap().constraint();
    let mut greedy = Sampler::new(SamplerParams::greedy(), env.n_vocab()).unwrap();
    let mut l = vec![0.0; env.n_vocab()];
    l[b'z' as usize] = 5.0;
    assert_eq!(c.sample(&mut greedy, &l).unwrap(), b'z' as u32);
    c.accept(TOOL).unwrap();
    assert_eq!(c.sample(&mut greedy, &l).unwrap(), b'o' as u32);
}

#[test]
fn objects_with_properties_are_closed_as_in_llama_cpp() {
    let g = |s: &str| compile(Grammar::json_schema_str(s).unwrap());
    let closed = g(r#"{"type":"object","properties":{"a":{"type":"integer"}}}"#);
    assert!(closed.matches(r#"{"a":1}"#) && closed.matches("{}") && !closed.matches(r#"{"a":1,"b":2}"#));
    let open = g(r#"{"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":true}"#);
    assert!(open.matches(r#"{"a":1,"b":2}"#));
    assert!(g(r#"{"type":"object"}"#).matches(r#"{"b":2}"#));
    // Nested objects are closed too; a property named "properties" is a property.
    let nested = g(r#"{"properties":{"properties":{"properties":{"x":{"type":"null"}}}}}"#);
    assert!(nested.matches(r#"{"properties":{"x":null}}"#));
    assert!(!nested.matches(r#"{"properties":{"x":null,"y":1}}"#) && !nested.matches(r#"{"z":1}"#));
    // allOf branches (and the schemas they reference) are merged, so stay open.
    let all = g(r##"{"$defs":{"base":{"properties":{"a":{"type":"integer"}},"required":["a"]}},
        "allOf":[{"$ref":"#/$defs/base"},{"properties":{"b":{"type":"integer"}},"required":["b"]}]}"##);
    assert!(all.matches(r#"{"a":1,"b":2}"#));
}

#[test]
fn regexes() {
    let cases: &[(&str, &[&str], &[&str])] = &[
        (r"\d{3}-\d{4}", &["555-1234"], &["5551234", "555-123", "555-12345"]),
        (r"[A-Z][a-z]+( [A-Z][a-z]+)*", &["Ada", "Ada Lovelace"], &["ada", "Ada ", "Ada  Lovelace"]),
        (r"(?i)yes|no", &["YES", "no", "No"], &["yess", "n"]),
        (r"a{2,3}b?", &["aa", "aaab"], &["a", "aaaa", "aab b"]),
        (r"[^\n]*\n", &["anything\n", "\n"], &["two\nlines\n", "no newline"]),
        (r"\p{Greek}+", &["αβγ"], &["abc"]),
        (r"é|ü{2}", &["é", "üü"], &["e", "ü"]),
        (r".", &["x", "é"], &["\n", "xy"]),
        (r"\w+@\w+\.com", &["ada@example.com"], &["ada@example.org", "@x.com"]),
        (r"(0|[1-9][0-9]*)(\.[0-9]+)?", &["0", "10.5"], &["01", "1.", ".5"]),
    ];
    for (rx, pass, fail) in cases {
        let g = compile(Grammar::Regex(rx.to_string()));
        for s in *pass {
            assert!(g.matches(s), "{rx} should match {s:?}");
        }
        for s in *fail {
            assert!(!g.matches(s), "{rx} should not match {s:?}");
        }
    }
    for bad in [r"(a", r"a{3,1}", r"[z-a]", r"(?<=a)b", r"\k<x>", r"\"] {
        let e = err(Grammar::Regex(bad.into()));
        assert!(e.starts_with("regex: invalid regex"), "{bad}: {e}");
    }
}

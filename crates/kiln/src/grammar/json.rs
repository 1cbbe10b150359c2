//! kiln's defaults for JSON schemas, applied before llguidance compiles them.
//!
//! - Whitespace: nothing, one space, or one or two newlines and an indent of up to 20
//!   blanks at each place JSON allows it (llama.cpp's `space` rule). Bounded, so a model
//!   cannot pad with newlines until `max_tokens`; pretty-printed output still fits.
//!
//! And three restrictions llama.cpp's converter makes, so the same schema allows the same
//! strings in both. Outputs stay valid against the schema (they are a subset of what it
//! allows), and a small model cannot wander off:
//! - Closed objects: an object schema that lists `properties` and says nothing of
//!   `additionalProperties` allows no other properties. `allOf` branches are left open,
//!   since the branches' properties are merged.
//! - A schema without `type` (nor `$ref`, `anyOf`, `oneOf`, `allOf`, `const`, `enum`)
//!   takes the type its keywords imply: `properties` (or a non-`true`
//!   `additionalProperties`) an object, `items`/`prefixItems` an array,
//!   `pattern`/`minLength`/`maxLength`/`format` a string.
//! - Integers have at most 16 digits (unless the schema's own bounds say otherwise).

use std::collections::HashSet;

use serde_json::{json, Map, Value};

use crate::error::{KilnError, Result};

const JSON_WHITESPACE: &str = r"( |\n{1,2}[ \t]{0,20})";

/// Keywords whose value is a map of subschemas, an array of them, or one.
const SCHEMA_MAPS: &[&str] = &["properties", "patternProperties", "$defs", "definitions", "dependentSchemas"];
const SCHEMA_LISTS: &[&str] = &["allOf", "anyOf", "oneOf", "prefixItems", "items"];
const SCHEMA_ONE: &[&str] = &[
    "additionalProperties",
    "items",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "propertyNames",
    "unevaluatedProperties",
    "unevaluatedItems",
    "additionalItems",
];

/// The schema with kiln's defaults added where it does not set them.
pub(crate) fn with_defaults(schema: &Value) -> Result<Value> {
    let mut s = schema.clone();
    match &mut s {
        Value::Object(map) => {
            map.entry("x-guidance").or_insert_with(|| json!({ "whitespace_pattern": JSON_WHITESPACE }));
        }
        Value::Bool(_) => return Ok(s),
        other => {
            return Err(KilnError::Grammar(format!(
                "JSON schema: a schema is an object or a boolean, not {}",
                json_type(other)
            )))
        }
    }
    let mut open = HashSet::new();
    find_all_of_branches(&s, "#", &mut open);
    restrict(&mut s, "#", &open);
    Ok(s)
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Calls `f` on each direct subschema of `map` with its JSON pointer.
fn for_each_subschema(map: &Map<String, Value>, path: &str, mut f: impl FnMut(&Value, String)) {
    for (k, v) in map {
        let p = format!("{path}/{}", escape(k));
        if SCHEMA_MAPS.contains(&k.as_str()) {
            if let Value::Object(m) = v {
                m.iter().for_each(|(name, sub)| f(sub, format!("{p}/{}", escape(name))));
            }
        } else if SCHEMA_LISTS.contains(&k.as_str()) && v.is_array() {
            v.as_array().into_iter().flatten().enumerate().for_each(|(i, sub)| f(sub, format!("{p}/{i}")));
        } else if SCHEMA_ONE.contains(&k.as_str()) {
            f(v, p);
        }
    }
}

/// The pointers of `allOf` branches, and of the schemas they `$ref`.
fn find_all_of_branches(v: &Value, path: &str, open: &mut HashSet<String>) {
    let Value::Object(map) = v else { return };
    if let Some(Value::Array(branches)) = map.get("allOf") {
        for (i, b) in branches.iter().enumerate() {
            open.insert(format!("{path}/allOf/{i}"));
            if let Some(r) = b.get("$ref").and_then(Value::as_str) {
                open.insert(r.trim_end_matches('/').to_string());
            }
        }
    }
    for_each_subschema(map, path, |sub, p| find_all_of_branches(sub, &p, open));
}

/// The largest integer of 16 digits.
const MAX_INTEGER: i64 = 9_999_999_999_999_999;

fn restrict(v: &mut Value, path: &str, open: &HashSet<String>) {
    let Value::Object(map) = v else { return };
    infer_type(map);
    bound_integers(map);
    let closable = map.contains_key("properties")
        && !map.contains_key("additionalProperties")
        && !map.contains_key("patternProperties")
        && !map.contains_key("unevaluatedProperties")
        && !open.contains(path);
    // Collect the children's pointers first (the walk below needs `map` mutably).
    let mut children = Vec::new();
    for_each_subschema(map, path, |_, p| children.push(p));
    let mut i = 0;
    for (k, sub) in map.iter_mut() {
        if SCHEMA_MAPS.contains(&k.as_str()) {
            if let Value::Object(m) = sub {
                for s in m.values_mut() {
                    restrict(s, &children[i], open);
                    i += 1;
                }
            }
        } else if SCHEMA_LISTS.contains(&k.as_str()) && sub.is_array() {
            for s in sub.as_array_mut().into_iter().flatten() {
                restrict(s, &children[i], open);
                i += 1;
            }
        } else if SCHEMA_ONE.contains(&k.as_str()) {
            restrict(sub, &children[i], open);
            i += 1;
        }
    }
    if closable {
        map.insert("additionalProperties".into(), Value::Bool(false));
    }
}

fn infer_type(map: &mut Map<String, Value>) {
    let decided = ["type", "$ref", "anyOf", "oneOf", "allOf", "const", "enum"];
    if decided.iter().any(|k| map.contains_key(*k)) {
        return;
    }
    let has = |keys: &[&str]| keys.iter().any(|k| map.contains_key(*k));
    let open_extra = map.get("additionalProperties").is_some_and(|a| a != &Value::Bool(true));
    let ty = if has(&["properties"]) || open_extra {
        "object"
    } else if has(&["items", "prefixItems"]) {
        "array"
    } else if has(&["pattern", "minLength", "maxLength", "format"]) {
        "string"
    } else {
        return;
    };
    map.insert("type".into(), Value::from(ty));
}

fn bound_integers(map: &mut Map<String, Value>) {
    let integer = match map.get("type") {
        Some(Value::String(t)) => t == "integer",
        Some(Value::Array(ts)) => ts.iter().any(|t| t == "integer"),
        _ => false,
    };
    if !integer {
        return;
    }
    let bound = |map: &Map<String, Value>, k: &str| map.get(k).and_then(Value::as_f64);
    let low = bound(map, "minimum").or(bound(map, "exclusiveMinimum"));
    let high = bound(map, "maximum").or(bound(map, "exclusiveMaximum"));
    if low.is_none() && high.is_none_or(|h| h >= -MAX_INTEGER as f64) {
        map.insert("minimum".into(), Value::from(-MAX_INTEGER));
    }
    if high.is_none() && low.is_none_or(|l| l <= MAX_INTEGER as f64) {
        map.insert("maximum".into(), Value::from(MAX_INTEGER));
    }
}

/// A JSON pointer token (RFC 6901).
fn escape(k: &str) -> String {
    k.replace('~', "~0").replace('/', "~1")
}

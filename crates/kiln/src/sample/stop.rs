//! Stop strings over streamed text.

/// Incremental stop-string matching over streamed text.
///
/// Text that might be the start of a stop string is held back until it is known not to
/// be; a match reports the text before it (the stop string itself and anything after it
/// are dropped).
///
/// ```
/// use kiln::sample::StopMatcher;
/// let mut m = StopMatcher::new(vec!["\nUser:".into()]);
/// assert_eq!(m.push("Hi!\nUs"), ("Hi!".to_string(), false));
/// assert_eq!(m.push("er: more"), (String::new(), true));
/// ```
#[derive(Clone, Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
    matched: bool,
}

impl StopMatcher {
    /// Empty stop strings are ignored.
    pub fn new(stops: Vec<String>) -> Self {
        let stops = stops.into_iter().filter(|s| !s.is_empty()).collect();
        StopMatcher { stops, held: String::new(), matched: false }
    }

    /// Whether a stop string has been seen.
    pub fn matched(&self) -> bool {
        self.matched
    }

    /// Feeds the next piece of text. Returns the text that is now safe to emit and
    /// whether a stop string matched (after a match, everything is swallowed).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        if self.matched {
            return (String::new(), true);
        }
        self.held.push_str(text);
        // Every match starts inside `held`: whatever was emitted before could not
        // begin any stop string.
        let first = self.stops.iter().filter_map(|s| self.held.find(s.as_str())).min();
        if let Some(pos) = first {
            self.matched = true;
            let mut out = std::mem::take(&mut self.held);
            out.truncate(pos);
            return (out, true);
        }
        let keep = self.stops.iter().map(|s| partial_suffix(&self.held, s)).max().unwrap_or(0);
        // The kept suffix equals a stop string's prefix, so it starts with that string's
        // first byte: always a char boundary.
        let rest = self.held.split_off(self.held.len() - keep);
        (std::mem::replace(&mut self.held, rest), false)
    }

    /// Ends the stream: returns the held-back text (empty after a match).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Clears the state for a new generation, keeping the stop strings.
    pub fn reset(&mut self) {
        self.held.clear();
        self.matched = false;
    }
}

/// Length of the longest proper prefix of `stop` that `text` ends with.
fn partial_suffix(text: &str, stop: &str) -> usize {
    let (t, s) = (text.as_bytes(), stop.as_bytes());
    let max = (s.len() - 1).min(t.len());
    (1..=max).rev().find(|&k| t[t.len() - k..] == s[..k]).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial() {
        assert_eq!(partial_suffix("abc", "cde"), 1);
        assert_eq!(partial_suffix("abcd", "cde"), 2);
        assert_eq!(partial_suffix("ab", "xyz"), 0);
        assert_eq!(partial_suffix("", "xyz"), 0);
        assert_eq!(partial_suffix("xyx", "xy"), 1);
        assert_eq!(partial_suffix("é", "éa"), 2); // multi-byte prefix
    }
}

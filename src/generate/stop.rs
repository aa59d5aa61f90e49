//! Stop strings over streamed text: text that could still turn into a stop string is held back,
//! so the caller never prints a stop string or a part of one.

/// What [`StopStrings::push`] found.
#[derive(Debug, Clone, PartialEq)]
pub enum StopOutcome {
    /// Text safe to emit now (possibly empty: it is being held back).
    Continue(String),
    /// A stop string matched: the text before it, to emit, and generation ends.
    Stop(String),
}

#[derive(Debug, Clone, Default)]
pub struct StopStrings {
    stops: Vec<String>,
    held: String,
}

impl StopStrings {
    /// Empty stop strings are ignored.
    pub fn new(stops: impl IntoIterator<Item = String>) -> StopStrings {
        StopStrings { stops: stops.into_iter().filter(|s| !s.is_empty()).collect(), held: String::new() }
    }

    /// Adds decoded text; returns what may be shown.
    pub fn push(&mut self, text: &str) -> StopOutcome {
        self.held.push_str(text);
        if let Some(at) = self.stops.iter().filter_map(|s| self.held.find(s.as_str())).min() {
            let before = self.held[..at].to_string();
            self.held.clear();
            return StopOutcome::Stop(before);
        }
        // Hold back the longest suffix that is a proper prefix of some stop string.
        let hold = self
            .stops
            .iter()
            .map(|s| longest_suffix_prefix(&self.held, s))
            .max()
            .unwrap_or(0);
        let cut = self.held.len() - hold;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        StopOutcome::Continue(out)
    }

    /// The held-back text, at the end of generation.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

/// Length in bytes of the longest suffix of `text` that is a proper prefix of `stop`, ending on
/// a char boundary of `text`.
pub(crate) fn longest_suffix_prefix(text: &str, stop: &str) -> usize {
    let max = text.len().min(stop.len().saturating_sub(1));
    (1..=max)
        .rev()
        .find(|&n| text.is_char_boundary(text.len() - n) && stop.as_bytes().starts_with(&text.as_bytes()[text.len() - n..]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut s = StopStrings::new(stops.iter().map(|s| s.to_string()));
        let mut out = String::new();
        for p in pieces {
            match s.push(p) {
                StopOutcome::Continue(t) => out.push_str(&t),
                StopOutcome::Stop(t) => {
                    out.push_str(&t);
                    return (out, true);
                }
            }
        }
        out.push_str(&s.flush());
        (out, false)
    }

    #[test]
    fn stop_split_across_pieces() {
        assert_eq!(run(&["\n\nUser:"], &["Hi", " there\n", "\nUs", "er: next"]), ("Hi there".into(), true));
    }

    #[test]
    fn near_miss_is_released() {
        assert_eq!(run(&["STOP"], &["ST", "OCK"]), ("STOCK".into(), false));
        assert_eq!(run(&["STOP"], &["ab", "ST"]), ("abST".into(), false));
    }

    #[test]
    fn earliest_of_several_wins() {
        assert_eq!(run(&["b", "a"], &["xxab"]), ("xx".into(), true));
    }

    #[test]
    fn multibyte_text_is_cut_on_char_boundaries() {
        assert_eq!(run(&["é!"], &["caf", "é", "?"]), ("café?".into(), false));
        assert_eq!(run(&["é!"], &["café", "!"]), ("caf".into(), true));
    }

    #[test]
    fn no_stops_passes_everything() {
        assert_eq!(run(&[""], &["a", "b"]), ("ab".into(), false));
    }
}

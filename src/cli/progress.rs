//! Progress bars on stderr, shown only when stderr is a terminal: model load (the weights are
//! paged in with a bar instead of stalling the first forward pass) and long prefills.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};

use crate::gguf::GgufFile;

/// Prompts at least this long get a prefill bar (about a second of prefill on 2 cores).
pub const PREFILL_BAR_TOKENS: usize = 256;

/// A bar, or nothing when stderr is not a terminal.
pub struct Progress(Option<ProgressBar>);

impl Progress {
    fn new(total: u64, template: &str, msg: &str) -> Progress {
        if !std::io::stderr().is_terminal() {
            return Progress(None);
        }
        let style = ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar());
        let bar = ProgressBar::new(total).with_style(style.progress_chars("=> "));
        bar.set_message(msg.to_string());
        Progress(Some(bar))
    }

    /// Counts bytes.
    pub fn bytes(total: u64, msg: &str) -> Progress {
        Progress::new(total, "{msg} [{bar:30}] {bytes}/{total_bytes}", msg)
    }

    /// Counts tokens.
    pub fn tokens(total: usize, msg: &str) -> Progress {
        Progress::new(total as u64, "{msg} [{bar:30}] {pos}/{len} tokens, {elapsed}", msg)
    }

    pub fn shown(&self) -> bool {
        self.0.is_some()
    }

    pub fn set(&self, done: u64) {
        if let Some(b) = &self.0 {
            b.set_position(done);
        }
    }

    /// Removes the bar from the screen.
    pub fn finish(&self) {
        if let Some(b) = &self.0 {
            b.finish_and_clear();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Pages the model in with a bar, on a terminal; does nothing otherwise.
pub fn load_with_bar(f: &GgufFile) {
    let bar = Progress::bytes(f.file_size(), "loading");
    if bar.shown() {
        f.prefault(|done, _| bar.set(done));
        bar.finish();
    }
}

//! Where a prompt's text comes from: the argument itself, a file (`-f FILE`, `-p @FILE`) or
//! standard input (`-p -`, `-f -`). Prompts are data: the bytes are taken as they are (no
//! trimming, no newline added or removed) and must be UTF-8; an invalid byte is an error that
//! names the source and the offset.
//!
//! `-p @FILE` reads FILE, as curl's `-d @FILE` does; a prompt that really starts with `@`
//! is written `@@…` (the first `@` is dropped).

use std::io::Read;
use std::path::{Path, PathBuf};

use super::CliError;

/// A prompt argument, before it is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromptSource {
    /// The text itself.
    Text(String),
    /// A file's bytes.
    File(PathBuf),
    /// Standard input, to its end.
    Stdin,
}

impl PromptSource {
    /// What `-p VALUE` means: `-` is standard input, `@FILE` a file, `@@…` the text `@…`.
    pub fn from_prompt_arg(value: &str) -> PromptSource {
        if value == "-" {
            PromptSource::Stdin
        } else if let Some(rest) = value.strip_prefix("@@") {
            PromptSource::Text(format!("@{rest}"))
        } else if let Some(path) = value.strip_prefix('@') {
            PromptSource::File(PathBuf::from(path))
        } else {
            PromptSource::Text(value.to_string())
        }
    }

    /// What `-f PATH` means: `-` is standard input, anything else a file.
    pub fn from_file_arg(path: &Path) -> PromptSource {
        if path.as_os_str() == "-" { PromptSource::Stdin } else { PromptSource::File(path.to_path_buf()) }
    }

    /// The prompt's text, byte for byte.
    pub fn read(&self) -> Result<String, CliError> {
        let (bytes, what) = match self {
            PromptSource::Text(t) => return Ok(t.clone()),
            PromptSource::File(p) => {
                let bytes = std::fs::read(p).map_err(|source| CliError::ReadFile { path: p.clone(), source })?;
                (bytes, p.display().to_string())
            }
            PromptSource::Stdin => {
                let mut bytes = Vec::new();
                std::io::stdin().lock().read_to_end(&mut bytes).map_err(|e| CliError::Stdin(e.to_string()))?;
                (bytes, "standard input".to_string())
            }
        };
        String::from_utf8(bytes).map_err(|e| CliError::PromptNotUtf8 { what, offset: e.utf8_error().valid_up_to() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_args_name_their_source() {
        assert_eq!(PromptSource::from_prompt_arg("-"), PromptSource::Stdin);
        assert_eq!(PromptSource::from_prompt_arg("-- list the tables"), PromptSource::Text("-- list the tables".into()));
        assert_eq!(PromptSource::from_prompt_arg("@p.txt"), PromptSource::File("p.txt".into()));
        assert_eq!(PromptSource::from_prompt_arg("@@user hi"), PromptSource::Text("@user hi".into()));
        assert_eq!(PromptSource::from_prompt_arg("a @b"), PromptSource::Text("a @b".into()));
        assert_eq!(PromptSource::from_file_arg(Path::new("-")), PromptSource::Stdin);
        assert_eq!(PromptSource::from_file_arg(Path::new("-x")), PromptSource::File("-x".into()));
    }

    #[test]
    fn files_are_read_byte_for_byte_and_checked() {
        let dir = std::env::temp_dir().join(format!("minfer-prompt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ok = dir.join("ok.txt");
        std::fs::write(&ok, "  two lines\r\n\n").unwrap();
        assert_eq!(PromptSource::File(ok).read().unwrap(), "  two lines\r\n\n");
        let bad = dir.join("bad.txt");
        std::fs::write(&bad, b"abc\xffdef").unwrap();
        let e = PromptSource::File(bad.clone()).read().unwrap_err();
        assert!(matches!(&e, CliError::PromptNotUtf8 { offset: 3, .. }), "{e}");
        assert!(e.to_string().contains("bad.txt") && e.to_string().contains("byte 3"), "{e}");
        let missing = PromptSource::File(dir.join("missing.txt")).read().unwrap_err();
        assert!(missing.to_string().contains("missing.txt"), "{missing}");
        std::fs::remove_dir_all(dir).ok();
    }
}

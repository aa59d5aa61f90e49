//! Standard output that treats a closed pipe (`minfer info m.gguf | head`) as a normal end.

use std::io::{self, Write};

use super::CliError;

pub struct Out {
    inner: io::BufWriter<io::Stdout>,
    closed: bool,
}

impl Out {
    pub fn stdout() -> Out {
        Out { inner: io::BufWriter::new(io::stdout()), closed: false }
    }

    /// Writes a line; a broken pipe silently ends all further output.
    pub fn line(&mut self, s: impl AsRef<str>) -> Result<(), CliError> {
        self.write(s.as_ref())?;
        self.write("\n")
    }

    pub fn write(&mut self, s: &str) -> Result<(), CliError> {
        if self.closed {
            return Ok(());
        }
        match self.inner.write_all(s.as_bytes()) {
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {
                self.closed = true;
                Ok(())
            }
            r => r.map_err(CliError::Output),
        }
    }

    /// Flushes what is buffered (streamed tokens must show as they come).
    pub fn flush(&mut self) -> Result<(), CliError> {
        if self.closed {
            return Ok(());
        }
        match self.inner.flush() {
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {
                self.closed = true;
                Ok(())
            }
            r => r.map_err(CliError::Output),
        }
    }

    /// Flushes and passes the command's result through.
    pub fn finish(mut self, r: Result<(), CliError>) -> Result<(), CliError> {
        let flushed = self.flush();
        r.and(flushed)
    }
}

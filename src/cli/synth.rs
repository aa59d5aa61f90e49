//! `minfer synth`: a synthetic GGUF with a real model's tensors and random valid blocks
//! ([`crate::models::profile`]), or that model's profile as JSON.

use std::path::{Path, PathBuf};

use super::{CliError, Out};
use crate::gguf::GgufFile;
use crate::models::profile::Profile;

#[derive(Debug, Clone, clap::Args)]
pub struct SynthArgs {
    /// The model to imitate: a built-in profile (qwen2.5-0.5b-q4_k_m, qwen2.5-1.5b-q4_k_m) or
    /// a GGUF file whose shape is copied.
    #[arg(long, allow_hyphen_values = true)]
    pub like: String,
    /// Where to write the synthetic model.
    #[arg(short, long, allow_hyphen_values = true)]
    pub output: Option<PathBuf>,
    /// Seed of the random weights (the same seed writes the same file).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print the profile (the shape, as JSON) instead of writing a model.
    #[arg(long)]
    pub print_profile: bool,
    /// The profile's name (default: the file's stem).
    #[arg(long)]
    pub name: Option<String>,
}

fn profile_of(like: &str, name: Option<&str>) -> Result<Profile, CliError> {
    let path = Path::new(like);
    if path.extension().is_some_and(|e| e == "gguf") || path.is_file() {
        let file = GgufFile::open(path)?;
        let stem = || path.file_stem().map_or_else(|| like.to_string(), |s| s.to_string_lossy().into_owned());
        let name = name.map_or_else(stem, str::to_string);
        return Ok(Profile::of_file(&file, &name)?);
    }
    Ok(Profile::builtin(like)?)
}

pub fn run(out: &mut Out, args: &SynthArgs) -> Result<(), CliError> {
    let profile = profile_of(&args.like, args.name.as_deref())?;
    if args.print_profile {
        return out.line(profile.to_json_text());
    }
    let Some(path) = &args.output else {
        return Err(CliError::Usage("give -o FILE (where to write the synthetic model) or --print-profile"));
    };
    let mut failed = None;
    crate::generate::durable::write_atomic(path, |w| {
        profile.write_synthetic(w, args.seed).map_err(|e| {
            let msg = e.to_string();
            failed = Some(e);
            std::io::Error::other(msg)
        })
    })
    .map_err(|e| match failed.take() {
        Some(p) => CliError::Profile(p),
        None => CliError::WriteFile { path: path.clone(), source: std::io::Error::other(e.to_string()) },
    })?;
    out.line(format!(
        "{}: {} tensors, {:.1} MiB of random weights shaped like {} ({})",
        path.display(),
        profile.tensors.len(),
        profile.data_bytes() as f64 / (1024.0 * 1024.0),
        profile.name,
        profile.source
    ))
}

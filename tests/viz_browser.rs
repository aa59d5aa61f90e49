//! The visualizer in a real browser: `tests/browser/viz.test.mjs` drives Debian's chromium with
//! playwright-core against a running `minfer viz` on the 0.5B (a 5-token trace loads, a live run
//! streams per-node statistics equal to the CLI's trace, a NaN is highlighted) and saves a
//! screenshot to the path it prints. `scripts/test.sh` installs chromium and playwright-core;
//! without them this test fails and says so.

mod common;

use std::path::Path;
use std::process::Command;

#[test]
fn the_visualizer_works_in_a_real_browser() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser");
    assert!(
        dir.join("node_modules/playwright-core").is_dir(),
        "playwright-core is missing: run scripts/test.sh (it runs npm ci in tests/browser)"
    );
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(Path::new(&chromium).is_file(), "{chromium} is missing: run scripts/test.sh (it installs Debian's chromium)");
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("viz-browser");
    // The script's lines (each check, the screenshot's path) go straight to the test log.
    let status = Command::new("node")
        .arg("viz.test.mjs")
        .current_dir(&dir)
        .env("MINFER_BIN", env!("CARGO_BIN_EXE_minfer"))
        .env("MODEL", common::model_path(common::QWEN2_05B))
        .env("OUT_DIR", &out)
        .env("CHROMIUM", &chromium)
        .status()
        .expect("node runs (Node.js is on the machine)");
    assert!(status.success(), "the browser test failed (its checks are above)");
}

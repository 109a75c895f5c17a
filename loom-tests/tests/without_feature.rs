#![cfg(loom)]
#![cfg(not(feature = "nicework-loom"))]
//! nicework built with `--cfg loom` but without its `loom` feature, as a user who forgot
//! the feature gets it: its primitives are std's, so a model explores none of its
//! interleavings, and it says so on stderr once per process, also inside `loom::model`
//! (whose own `tracing` subscriber drops the warning event). Run with
//! `RUSTFLAGS="--cfg loom" cargo test -p loom-tests --release --no-default-features
//! --test without_feature` (CI does).

use std::process::Command;

const WARNING: &str = "nicework is built with --cfg loom but without its `loom` feature";

#[test]
fn the_warning_reaches_stderr_once_inside_a_loom_model() {
    if std::env::var_os("NICEWORK_WITHOUT_FEATURE_CHILD").is_some() {
        loom::model(|| {
            for _ in 0..3 {
                drop(nicework::Scheduler::manual());
            }
        });
        return;
    }
    // The child runs the model uncaptured, with its stderr collected here.
    let output = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "the_warning_reaches_stderr_once_inside_a_loom_model",
            "--test-threads=1",
            "--nocapture",
        ])
        .env("NICEWORK_WITHOUT_FEATURE_CHILD", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the child failed: {stderr}");
    assert_eq!(stderr.matches(WARNING).count(), 1, "stderr: {stderr}");
}

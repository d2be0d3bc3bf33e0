//! Tests that run (part of) themselves in a child process: the test binary
//! started again with `--exact` on one test. A test binary holds many
//! modules, so the name a child is started with is the test's full path
//! inside the binary, taken from `module_path!()`.

use std::process::{Child, Command};

/// The environment variable set in a process started by [`run_alone`].
const ALONE: &str = "SG_TEST_ALONE";

/// The name the test harness knows test `test` of module `module_path` by
/// (`module_path!()` starts with the binary's own name, which the harness
/// leaves out).
pub fn test_name(module_path: &str, test: &str) -> String {
    match module_path.split_once("::") {
        Some((_, inside)) => format!("{inside}::{test}"),
        None => test.to_owned(),
    }
}

/// Whether this process was started by [`run_alone`]: the test it names is
/// the only one running in it.
pub fn alone() -> bool {
    std::env::var_os(ALONE).is_some()
}

/// Runs test `test` of module `module_path` again in a process of its own
/// (for a test that measures or changes what is process-wide: the heap, the
/// crypto provider), and fails unless it ran there and passed.
pub fn run_alone(module_path: &str, test: &str) {
    let name = test_name(module_path, test);
    let output = Command::new(std::env::current_exe().expect("test binary"))
        .args([name.as_str(), "--exact", "--nocapture", "--test-threads=1"])
        .env(ALONE, "1")
        .output()
        .expect("the test binary starts");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "{name}, alone in its process:\n{stdout}\n{stderr}"
    );
    print!("{stdout}");
}

/// A child process, killed and reaped however the test ends.
pub struct ChildProcess(pub Child);

impl ChildProcess {
    /// Sends `sig` (`-STOP`, `-CONT`, …) to the process.
    pub fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .args([sig, &self.0.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success());
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

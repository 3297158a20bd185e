//! Names the build: the commit the binary was built from, as `WATCHRELAY_COMMIT` at compile
//! time (`watchrelay version` prints it).
//!
//! An image build has no `.git` (it is left out of the build context), so the commit comes from
//! the environment variable `WATCHRELAY_COMMIT` when set (the Dockerfile's build argument of that
//! name); otherwise from `git rev-parse HEAD` when this package's directory is a git checkout;
//! otherwise it is `unknown`.

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=WATCHRELAY_COMMIT");
    let commit = std::env::var("WATCHRELAY_COMMIT")
        .ok()
        .map(|c| c.trim().to_owned())
        .filter(|c| !c.is_empty())
        .or_else(from_git)
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=WATCHRELAY_COMMIT={commit}");
}

/// HEAD's commit, when the package directory itself is a checkout: never a repository that
/// merely contains a copy of the sources.
fn from_git() -> Option<String> {
    let dir = std::env::var("CARGO_MANIFEST_DIR").ok()?;
    if !Path::new(&dir).join(".git").exists() {
        return None;
    }
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git")
            .args(args)
            .current_dir(&dir)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    // Rebuild when HEAD moves: its file, the branch it names, and the packed refs (only files
    // that exist: cargo takes a missing one for changed, at every build).
    let branch = git(&["symbolic-ref", "-q", "HEAD"]);
    for name in ["HEAD", "packed-refs"].into_iter().chain(branch.as_deref()) {
        if let Some(path) = git(&["rev-parse", "--git-path", name]) {
            let path = Path::new(&dir).join(path);
            if path.exists() {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
    }
    git(&["rev-parse", "HEAD"]).filter(|c| !c.is_empty())
}

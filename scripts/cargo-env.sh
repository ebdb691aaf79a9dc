# Sourced by scripts/test.sh (and by the fresh root's run of the README's commands): how the test command runs cargo.
#
# clippy's lints come with the build itself: clippy-driver (rustc with clippy's lints, a documented drop-in) is the
# compiler of the workspace's own crates (RUSTC_WORKSPACE_WRAPPER; dependencies are compiled by rustc as usual),
# with warnings as errors. That is `cargo clippy --workspace --all-targets -- -D warnings` without a second
# compilation of every crate in check mode. A build without these variables (a developer's `cargo build`) lints
# nothing and rebuilds the workspace's crates once.
#
# IRONGUARD_LINTS=0 builds without them: the fresh Debian roots (scripts/fresh-root.sh) set it. The lints are a
# property of the code and the toolchain, both the same there (the toolchain is this machine's, bound in), and the
# test command on this machine has linted this very checkout; in a root they cost a sixth of its build (97 -> 81
# CPU-seconds a root, measured on 2026-12-07) and proved nothing of the system.
if [ "${IRONGUARD_LINTS:-1}" = 0 ]; then
  unset RUSTC_WORKSPACE_WRAPPER CLIPPY_ARGS
else
  clippy_driver=$(rustup which clippy-driver 2>/dev/null || command -v clippy-driver || true)
  if [ -z "$clippy_driver" ]; then
    echo "cargo-env: clippy-driver not found (rustup component add clippy)" >&2
    return 1
  fi
  export RUSTC_WORKSPACE_WRAPPER=$clippy_driver
  export CLIPPY_ARGS=-Dwarnings
fi
# Builds from scratch (CI, the fresh roots) gain nothing from incremental compilation, and it doubles the disk used.
export CARGO_INCREMENTAL=0
# ... nor from splitting each crate's code generation in 16 units: on 2 cores the crates already build side by side,
# and every unit generates again the generic and inline code it uses. One unit per crate: the test command's build
# took 450 CPU-s instead of 540, and 235 s instead of 280, measured one after the other on 2026-12-07 (a
# developer's incremental build keeps cargo's defaults).
export CARGO_PROFILE_DEV_CODEGEN_UNITS=1

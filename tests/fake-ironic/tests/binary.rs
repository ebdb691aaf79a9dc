//! The `fake-ironic` binary: prints where it listens, serves populated nodes, obeys the admin API, and exits
//! cleanly on SIGTERM.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Stdio;
use std::time::Duration;

use fake_ironic::client;
use serde_json::json;
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::Command;

#[tokio::test]
async fn binary_serves_until_sigterm() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_fake-ironic"))
        .args(["--listen", "127.0.0.1:0", "--nodes", "5", "--ports-per-node", "2", "--provision-state", "inspect wait"])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut line = String::new();
    tokio::time::timeout(Duration::from_secs(30), BufReader::new(stdout).read_line(&mut line)).await.unwrap().unwrap();
    let url =
        line.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("unexpected line {line:?}")).to_owned();
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");

    let body = client::get(&format!("{url}/v1/nodes?provision_state=inspect%20wait")).await.unwrap().json().unwrap();
    assert_eq!(body["nodes"].as_array().unwrap().len(), 5);
    let body = client::get(&format!("{url}/v1/ports?fields=address")).await.unwrap().json().unwrap();
    assert_eq!(body["ports"].as_array().unwrap().len(), 10);

    let resp =
        client::send_json("POST", &format!("{url}/_fake/faults"), &json!({"status": 503, "count": 1})).await.unwrap();
    assert_eq!(resp.status, 201);
    assert_eq!(client::get(&format!("{url}/v1/nodes")).await.unwrap().status, 503);
    assert_eq!(client::get(&format!("{url}/v1/nodes")).await.unwrap().status, 200);
    let calls = client::get(&format!("{url}/_fake/calls")).await.unwrap().json().unwrap();
    assert_eq!(calls.as_array().unwrap().len(), 4);

    let pid = child.id().unwrap().to_string();
    let killed = Command::new("kill").args(["-TERM", &pid]).status().await.unwrap();
    assert!(killed.success());
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait()).await.unwrap().unwrap();
    assert!(status.success(), "{status}");
}

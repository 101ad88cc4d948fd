//! The README's code examples build and run: `examples/readme.rs` holds them (compiled by
//! `cargo test`), this test runs them and checks that every line of every Rust block of the
//! README stands in that file, so the README shows only code that builds.

#[path = "../examples/readme.rs"]
mod readme;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_examples_run() {
    readme::using_it().await.expect("the first README block");
    readme::two_instances()
        .await
        .expect("the second README block");
}

#[test]
fn every_line_of_the_readme_rust_blocks_stands_in_the_example() {
    let readme = include_str!("../../README.md");
    let example: Vec<&str> = include_str!("../examples/readme.rs")
        .lines()
        .map(str::trim)
        .collect();
    let mut in_rust = false;
    let mut checked = 0;
    for line in readme.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with("```") {
            in_rust = !in_rust && trimmed == "```rust";
            continue;
        }
        if in_rust && !trimmed.is_empty() {
            assert!(
                example.contains(&trimmed),
                "README line not in host/examples/readme.rs: `{trimmed}`"
            );
            checked += 1;
        }
    }
    assert!(
        checked >= 10,
        "only {checked} README lines found in ```rust blocks"
    );
}

//! `mlxbar bench --concurrency 1,4,8`: N streams at once against each server, interleaved
//! level by level, reporting aggregate tok/s and the TTFT and inter-token latency
//! percentiles the streams saw. This is how batching claims are made.
use std::time::{Duration, Instant};

use anyhow::Result;
use serde::Serialize;
use serde_json::json;

use super::client::{timed_chat, Target};
use super::quantile;

/// One server at one concurrency level.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    pub label: String,
    pub streams: usize,
    pub wall_seconds: f64,
    pub completion_tokens: usize,
    pub aggregate_tok_s: f64,
    pub ttft_p50: f64,
    pub ttft_p90: f64,
    pub itl_p50: f64,
    pub itl_p90: f64,
    pub errors: usize,
}

/// Prompts differ per stream and per round, so no server can reuse a cached prefix.
fn prompt(round: usize, stream: usize) -> serde_json::Value {
    json!([
        {"role": "system", "content": format!("You are a helpful assistant. Session {round}-{stream}.")},
        {"role": "user", "content": "Write a long, detailed story about a lighthouse keeper who finds a message in a bottle on a stormy night."}
    ])
}

/// Runs `streams` chats at once against `t`.
pub async fn cell(client: &reqwest::Client, t: &Target, streams: usize, max_tokens: usize, round: usize) -> Result<Cell> {
    let start = Instant::now();
    let runs = futures::future::join_all((0..streams).map(|s| {
        let messages = prompt(round, s);
        async move { timed_chat(client, t, &messages, max_tokens).await }
    }))
    .await;
    let wall = start.elapsed();
    let (mut ttft, mut itl, mut tokens, mut errors) = (vec![], vec![], 0, 0);
    for r in runs {
        match r {
            Ok(r) => {
                ttft.push(r.ttft.as_secs_f64());
                itl.extend(r.gaps.iter().map(Duration::as_secs_f64));
                tokens += r.completion_tokens;
            }
            Err(e) => {
                errors += 1;
                eprintln!("{}: {e:#}", t.label);
            }
        }
    }
    Ok(Cell {
        label: t.label.clone(),
        streams,
        wall_seconds: wall.as_secs_f64(),
        completion_tokens: tokens,
        aggregate_tok_s: tokens as f64 / wall.as_secs_f64().max(1e-9),
        ttft_p50: quantile(&mut ttft, 0.5),
        ttft_p90: quantile(&mut ttft, 0.9),
        itl_p50: quantile(&mut itl, 0.5),
        itl_p90: quantile(&mut itl, 0.9),
        errors,
    })
}

/// Every level for every target, interleaved (level by level, target by target) so drift
/// on a shared machine hits all alike.
pub async fn run(client: &reqwest::Client, targets: &[Target], levels: &[usize], max_tokens: usize) -> Result<Vec<Cell>> {
    let mut cells = vec![];
    for (round, &streams) in levels.iter().enumerate() {
        for t in targets {
            let c = cell(client, t, streams, max_tokens, round + 1).await?;
            eprintln!(
                "{:<12} {:>2} streams: {:>6.1} tok/s aggregate, TTFT p50 {:.2}s p90 {:.2}s, ITL p50 {:.0}ms p90 {:.0}ms{}",
                c.label,
                c.streams,
                c.aggregate_tok_s,
                c.ttft_p50,
                c.ttft_p90,
                c.itl_p50 * 1e3,
                c.itl_p90 * 1e3,
                if c.errors > 0 { format!(", {} errors", c.errors) } else { String::new() }
            );
            cells.push(c);
        }
    }
    Ok(cells)
}

/// Markdown table; ratios are aggregate tok/s against the first server at the same level.
pub fn table(cells: &[Cell]) -> String {
    let mut out = String::from("\n| server | streams | aggregate tok/s | TTFT p50 | TTFT p90 | ITL p50 | ITL p90 | aggregate × vs first |\n|---|---|---|---|---|---|---|---|\n");
    for c in cells {
        let base = cells.iter().find(|b| b.streams == c.streams).unwrap();
        out += &format!(
            "| {} | {} | {:.1} | {:.2} s | {:.2} s | {:.0} ms | {:.0} ms | {:.2} |\n",
            c.label,
            c.streams,
            c.aggregate_tok_s,
            c.ttft_p50,
            c.ttft_p90,
            c.itl_p50 * 1e3,
            c.itl_p90 * 1e3,
            c.aggregate_tok_s / base.aggregate_tok_s.max(1e-9)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_and_ratios() {
        let mut v = vec![5.0, 1.0, 3.0, 2.0, 4.0];
        assert_eq!((quantile(&mut v, 0.5), quantile(&mut v, 0.9)), (3.0, 5.0));
        assert_eq!(quantile(&mut [], 0.5), 0.0);
        let cell = |label: &str, streams, agg| Cell { label: label.into(), streams, wall_seconds: 1.0, completion_tokens: 1, aggregate_tok_s: agg, ttft_p50: 0.1, ttft_p90: 0.2, itl_p50: 0.05, itl_p90: 0.06, errors: 0 };
        let t = table(&[cell("a", 1, 10.0), cell("b", 1, 5.0), cell("a", 8, 40.0), cell("b", 8, 80.0)]);
        assert!(t.contains("| b | 1 | 5.0 | 0.10 s | 0.20 s | 50 ms | 60 ms | 0.50 |"), "{t}");
        assert!(t.contains("| b | 8 | 80.0 | 0.10 s | 0.20 s | 50 ms | 60 ms | 2.00 |"), "{t}");
    }
}

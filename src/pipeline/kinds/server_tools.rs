//! Anthropic's tools on the Messages endpoint, sorted by who runs them and what they bill.
//! Client tools (custom ones, and Anthropic's `bash_*`, `text_editor_*`, `computer_*`,
//! `memory_*`: the model writes a call, the client runs it) cost tokens only. Server tools
//! run at Anthropic: a web search is billed per call and its results come back as input;
//! a web fetch brings a page back as input. Both are capped here (`max_uses`, and a
//! fetch's `max_content_tokens`) so the reservation bounds them; every sampling step of
//! the turn re-reads the results before it (`turn`). Code execution (billed per
//! container-hour), MCP servers (tool results of any size, as input) and any server tool
//! not known here cannot be bounded: refused.

use serde_json::{json, Map, Value};

use super::turn::Turn;
use super::Kinds;
use crate::config::FinanceSettings;
use crate::error::ApiError;

/// Anthropic-defined tools the client executes (the upstream only writes their calls).
const CLIENT_TOOLS: &[&str] = &["bash_", "text_editor_", "computer_", "memory_"];

/// Caps the server tools of `body` and notes in `kinds` the searches they may make and the
/// input their results may add, or refuses what cannot be bounded.
pub fn read(
    body: &mut Map<String, Value>,
    finance: &FinanceSettings,
    kinds: &mut Kinds,
) -> Result<(), ApiError> {
    if body
        .get("mcp_servers")
        .is_some_and(|m| !m.is_null() && m.as_array().is_none_or(|a| !a.is_empty()))
    {
        return Err(ApiError::invalid(
            "mcp_servers",
            "`mcp_servers` is not accepted: the servers' tool results are billed as input \
             of any size, which the gateway cannot bound in advance",
        ));
    }
    let Some(Value::Array(tools)) = body.get_mut("tools") else {
        return Ok(());
    };
    // Each server tool's (calls, page per call): the turn they make (`turn`).
    let mut calls_and_pages = Vec::new();
    for tool in tools.iter_mut() {
        let Some(t) = tool.as_object_mut() else {
            continue;
        };
        let kind = match t.get("type").and_then(Value::as_str) {
            None | Some("custom") => continue,
            Some(k) if CLIENT_TOOLS.iter().any(|p| k.starts_with(p)) => continue,
            Some(k) => k.to_string(),
        };
        if kind.starts_with("web_search_") {
            let calls = cap(t, "max_uses", finance.max_server_tool_calls, MOST_USES)?;
            let page = i64::from(finance.server_tool_input_tokens_per_call);
            kinds.web_search_calls = kinds.web_search_calls.saturating_add(calls);
            calls_and_pages.push((calls, page));
        } else if kind.starts_with("web_fetch_") {
            let calls = cap(t, "max_uses", finance.max_server_tool_calls, MOST_USES)?;
            let page = cap(
                t,
                "max_content_tokens",
                finance.server_tool_input_tokens_per_call,
                MOST_CONTENT_TOKENS,
            )?;
            calls_and_pages.push((calls, page));
        } else if kind.starts_with("code_execution_") {
            return Err(ApiError::invalid(
                "tools",
                format!(
                    "`tools`: the server tool `{kind}` is not accepted: code execution is billed per \
                     container-hour, which the gateway cannot bound in advance"
                ),
            ));
        } else {
            return Err(ApiError::invalid(
                "tools",
                format!(
                    "`tools`: the server tool `{kind}` is not accepted: the gateway cannot bound what \
                     it bills. Accepted: custom tools, bash, text editor, computer use, memory, \
                     web search and web fetch"
                ),
            ));
        }
    }
    kinds.server_tools = Turn::of(calls_and_pages);
    Ok(())
}

/// The most calls one server tool may be given (`max_uses`), and the most tokens a fetched
/// page may bring (`max_content_tokens`, past any model's context): a cap beyond them would
/// make the reservation saturate at `i64::MAX` and overflow every balance beside it.
const MOST_USES: i64 = 100;
const MOST_CONTENT_TOKENS: i64 = 1_000_000;

/// The tool's `field`, an integer in 1 ..= `most`, or — absent — `default`, written into
/// the tool so the upstream keeps to what was reserved.
fn cap(t: &mut Map<String, Value>, field: &str, default: u32, most: i64) -> Result<i64, ApiError> {
    match t.get(field) {
        None | Some(Value::Null) => {
            t.insert(field.into(), json!(default));
            Ok(i64::from(default))
        }
        Some(v) => v
            .as_i64()
            .filter(|n| (1..=most).contains(n))
            .ok_or_else(|| {
                ApiError::invalid(
                    "tools",
                    format!(
                        "`tools`: a server tool's `{field}` must be an integer from 1 to {most}"
                    ),
                )
            }),
    }
}

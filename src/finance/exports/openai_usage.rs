//! OpenAI's Usage API for completions (`GET /v1/organization/usage/completions`, saved as
//! JSON): pages of daily buckets (`data[].start_time`, Unix seconds) as the Costs API's
//! (`walk`), each with `results[]` of token counts — `input_tokens` (cached ones
//! included), `output_tokens`, `input_cached_tokens` — grouped by `model` (required: each
//! figure must name its model) and `api_key_id` / `project_id` when grouped by them.

use chrono::NaiveDate;
use serde::Deserialize;

use super::{self as exports, walk, ExportError, Figures};

/// One figure of a usage export: the tokens of (day, model, account).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Tokens {
    pub input: i64,
    pub output: i64,
    pub cached_input: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenLine {
    pub day: NaiveDate,
    /// The model as OpenAI names it.
    pub model: String,
    /// The API key id, then its project (`exports::Line::accounts`).
    pub accounts: Vec<String>,
    /// Which of the two it names (`exports::Line::named`).
    pub named: exports::Named,
    pub tokens: Tokens,
}

impl exports::Figure for TokenLine {
    fn named(&self) -> exports::Named {
        self.named
    }
}

#[derive(Deserialize)]
struct Bucket {
    start_time: i64,
    end_time: Option<i64>,
    results: Vec<Usage>,
}

#[derive(Deserialize)]
struct Usage {
    input_tokens: Option<i64>,
    output_tokens: Option<i64>,
    input_cached_tokens: Option<i64>,
    model: Option<String>,
    project_id: Option<String>,
    api_key_id: Option<String>,
}

pub fn read(text: &str) -> Result<Vec<TokenLine>, ExportError> {
    walk::<Bucket>(text)
}

/// The pages of one download saved as `files` (`exports::walk_files`), each a `Part`.
pub fn read_files(files: &[exports::File]) -> Result<Figures<TokenLine>, ExportError> {
    exports::walk_files::<Bucket>(files)
}

impl exports::Bucket for Bucket {
    type Item = TokenLine;

    fn start(&self) -> String {
        self.start_time.to_string()
    }

    fn end(&self) -> Option<String> {
        self.end_time.map(|t| t.to_string())
    }

    const START: &'static str = "start_time";
    const END: &'static str = "end_time";

    fn instant(written: &str) -> Option<chrono::DateTime<chrono::Utc>> {
        exports::openai_instant(written)
    }

    fn lines(self, at: &str, day: chrono::NaiveDate) -> Result<Vec<TokenLine>, ExportError> {
        exports::openai_bucket_lines(at, day, self.results, line)
    }
}

fn line(at: &str, day: NaiveDate, u: Usage) -> Result<TokenLine, ExportError> {
    let count = |v: Option<i64>, field: &str| match v {
        Some(n) if n >= 0 => Ok(n),
        None if field == "input_cached_tokens" => Ok(0),
        Some(n) => Err(ExportError::at(
            &format!("{at}.{field}"),
            format!("{n} is not a token count"),
        )),
        None => Err(ExportError::at(&format!("{at}.{field}"), "missing")),
    };
    let model = u.model.ok_or_else(|| {
        ExportError::at(
            &format!("{at}.model"),
            "missing: export the usage grouped by model (group_by=model) so each figure names its model",
        )
    })?;
    Ok(TokenLine {
        day,
        model,
        named: exports::Named::of(u.api_key_id.as_deref(), u.project_id.as_deref()),
        accounts: [u.api_key_id, u.project_id].into_iter().flatten().collect(),
        tokens: Tokens {
            input: count(u.input_tokens, "input_tokens")?,
            output: count(u.output_tokens, "output_tokens")?,
            cached_input: count(u.input_cached_tokens, "input_cached_tokens")?,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_usage_page_reads_its_counts_and_refuses_what_is_not_one() {
        let page = r#"{"object":"page","data":[{"object":"bucket","start_time":1730419200,
            "end_time":1730505600,"results":[{"object":"organization.usage.completions.result",
            "input_tokens":1000,"output_tokens":500,"input_cached_tokens":800,
            "num_model_requests":5,"project_id":"proj_a","user_id":null,"api_key_id":"key_1",
            "model":"gpt-4o-mini-2024-07-18","batch":null}]}],"has_more":false,"next_page":null}"#;
        let lines = read(page).unwrap();
        assert_eq!(
            lines,
            vec![TokenLine {
                day: NaiveDate::from_ymd_opt(2024, 11, 1).unwrap(),
                model: "gpt-4o-mini-2024-07-18".into(),
                accounts: vec!["key_1".into(), "proj_a".into()],
                named: exports::Named::of(Some("key_1"), Some("proj_a")),
                tokens: Tokens {
                    input: 1000,
                    output: 500,
                    cached_input: 800
                },
            }]
        );
        let unmodelled = page.replace(r#""model":"gpt-4o-mini-2024-07-18""#, r#""model":null"#);
        assert!(read(&unmodelled).unwrap_err().0.contains("group_by=model"));
        let negative = page.replace(r#""output_tokens":500"#, r#""output_tokens":-1"#);
        assert!(read(&negative).unwrap_err().0.contains("output_tokens"));
        let more = page.replace(r#""has_more":false"#, r#""has_more":true"#);
        assert!(read(&more).unwrap_err().0.contains("incomplete"));
        // A week's bucket would land whole on its first day: refused, as the Costs API's.
        let week = page.replace("1730505600", "1731024000");
        let e = read(&week).unwrap_err().0;
        assert!(
            e.contains("data[0].end_time") && e.contains("UTC day"),
            "{e}"
        );
    }
}

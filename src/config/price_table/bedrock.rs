//! Bedrock's model ids of the bundled Claude models, and what AWS bills them at.
//!
//! A Bedrock route names its model by Bedrock's id, `[<geo>.]anthropic.<name>[-<date>]
//! [-v<N>[:<M>]]` (`anthropic.claude-sonnet-4-5-20250929-v1:0`, the inference profile
//! `global.anthropic.claude-sonnet-4-5-20250929-v1:0`, and for Claude 4.6 and later
//! `anthropic.claude-opus-4-6-v1` and `anthropic.claude-sonnet-4-6`, as Anthropic's page
//! on Bedrock lists them). Such an id of a bundled Claude model of 4.5 or later is priced
//! from that model's entries, every kind they carry:
//!
//! - on a `global.` profile at Anthropic's list price, and
//! - on any other (a geographic profile `us.` / `eu.` / `apac.` / `jp.` / `au.` / `in.`, or the
//!   bare id, served in one Region) at 1.1 × it, each rate rounded up to the micro-dollar
//!   per million tokens, web search included.
//!
//! Sources, read 2026-12-04:
//! - AWS, <https://docs.aws.amazon.com/bedrock/latest/userguide/global-cross-region-inference.html>:
//!   "Global cross-Region inference for Anthropic's Claude Sonnet 4.5 offers approximately
//!   10% savings on both input and output token pricing compared to geographic
//!   cross-Region inference."
//! - <https://sam.mehdi.consulting/posts/saving-money-on-bedrock-is-hard/>: "The lower
//!   rates on the Bedrock pricing page are the global inference rates. Geographic and
//!   in-region inference costs 10% more."
//! - <https://clauder-navi.com/en/bedrock-claude-cost/>: "Starting with Claude Sonnet 4.5
//!   / Haiku 4.5 / Opus 4.5, Bedrock offers two endpoint types: a global endpoint and a
//!   regional endpoint — with regional priced 10% higher than global"; and "The older
//!   Claude 3.5 Sonnet is priced at $6 / $30 on Bedrock" — twice Anthropic's list price.
//!
//! - Re-checked 2026-12-05: genai-prices 0.2.5 (PyPI; its AWS rows cite the AWS price
//!   list API, "Claude … (Amazon Bedrock Edition)") prices every geographic profile — `in.`
//!   (India) among them — and the bare in-Region id at exactly 1.1 × the `global.` rate,
//!   which is Anthropic's list, on every rate of every Claude of 4.5 and later (85 rates),
//!   and with no premium before 4.5; LiteLLM 1.110.2 agrees on the profiles (340 rates).
//!
//! Neither Anthropic's statement of it nor AWS's own page was found stored: the 1.1 × is
//! the third parties' figure, AWS's price list as genai-prices reads it, and what AWS's
//! "approximately 10% savings" gives (global is 1 / 1.1 of regional, 9.1 % less). Every
//! rate is rounded up.
//!
//! Claude before 4.5 is not priced here: Bedrock bills a model it serves past Anthropic's
//! retirement above Anthropic's list (Claude 3.5 Sonnet, above), and no source gives
//! Bedrock's price of the others per Region. Such an id, like any other (an ARN,
//! `amazon.nova-…`), needs its price in config and is refused at start without one
//! (`Settings::check_priced`).

use std::sync::Arc;

use chrono::{DateTime, NaiveDate, Utc};

use super::{without_date_suffix, Table};
use crate::quota::schedule::Dated;

/// The cross-Region inference profiles' prefixes; `global` is the one at the list price.
const GEOS: [&str; 7] = ["us", "eu", "apac", "jp", "au", "in", "global"];

/// The regional premium, in thousandths: 1.1 × the global (list) price.
const REGIONAL_PERMILLE: i64 = 1_100;

/// Claude Sonnet 4.5's launch: a bundled Claude model whose first entry takes effect on or
/// after it is "Claude 4.5 or later", billed on Bedrock as the sources above say.
fn current_from() -> DateTime<Utc> {
    // 2025-09-29 and its midnight exist: no `None` here. Were there one, no model would
    // count as current, and none would be priced here (refused at start, never below).
    NaiveDate::from_ymd_opt(2025, 9, 29)
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .map_or(DateTime::<Utc>::MAX_UTC, |t| t.and_utc())
}

/// A Bedrock id of a bundled Claude model: its inference-profile prefix, if any, and the
/// bundled model's name (the table's own string).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaudeId<'a> {
    pub geo: Option<&'static str>,
    pub model: &'a str,
}

/// `id` read as `[<geo>.]anthropic.<bundled Claude name>[-<date>][-v<N>[:<M>]]`, exactly:
/// anything else (an ARN, `amazon.nova-…`, a name the table does not hold as Anthropic's,
/// another prefix) is `None`.
pub fn claude_id<'a>(table: &'a Table, id: &str) -> Option<ClaudeId<'a>> {
    let (geo, rest) = match id.split_once('.') {
        Some((prefix, rest)) => match GEOS.iter().find(|g| **g == prefix) {
            Some(geo) => (Some(*geo), rest),
            None => (None, id),
        },
        None => (None, id),
    };
    let name = without_version(rest.strip_prefix("anthropic.")?)?;
    let model = [Some(name), without_date_suffix(name)]
        .into_iter()
        .flatten()
        .find_map(|n| table.family.get_key_value(n))
        .filter(|(_, family)| family.as_str() == "anthropic")
        .map(|(model, _)| model.as_str())?;
    Some(ClaudeId { geo, model })
}

/// `name` without Bedrock's version suffix `-v<N>` or `-v<N>:<M>`; `name` itself when it
/// has none; `None` when it has a malformed one.
fn without_version(name: &str) -> Option<&str> {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let Some((head, version)) = name.rsplit_once("-v") else {
        return Some(name);
    };
    let well_formed = match version.split_once(':') {
        Some((major, minor)) => digits(major) && digits(minor),
        None => digits(version),
    };
    well_formed.then_some(head)
}

/// Whether `region` is in AWS's commercial partition, whose prices these are: not
/// GovCloud (`us-gov-`), China (`cn-`), an isolated Region (`-iso` in its name: `us-iso-`,
/// `us-isob-`, `us-isof-`, `eu-isoe-`) or the European Sovereign Cloud (`eusc-`), each
/// billed by a price list of its own (s21a #3).
/// Case aside: a host's name, and an operator's typing of it, may be in capitals.
pub fn commercial(region: &str) -> bool {
    let region = region.to_ascii_lowercase();
    !(["us-gov-", "cn-", "eusc-"]
        .iter()
        .any(|p| region.starts_with(p))
        || region.contains("-iso"))
}

/// The Region a Bedrock upstream is priced in: of its `region` and the one its
/// `base_url`'s host names (`bedrock-runtime[-fips].<region>.…`), one outside the
/// commercial partition if either is — requests go where the URL says, and with an API
/// key nothing holds it to `region`.
pub fn billing_region<'a>(region: Option<&'a str>, base_url: &'a str) -> Option<&'a str> {
    let host = base_url
        .split_once("://")
        .map_or(base_url, |(_, rest)| rest)
        .split(['/', ':'])
        .next()
        .unwrap_or_default();
    let in_url = host
        .split('.')
        .skip_while(|label| !label.to_ascii_lowercase().starts_with("bedrock-runtime"))
        .nth(1);
    [in_url, region]
        .into_iter()
        .flatten()
        .find(|r| !commercial(r))
        .or(region)
        .or(in_url)
}

/// The bundled prices of a Bedrock route to `id`, when it is the id of a bundled Claude
/// model of 4.5 or later: the model's entries, at 1.1 × off a `global.` profile; `None`
/// otherwise (the caller keeps the name's own match).
pub fn prices(table: &Table, id: &str) -> Option<Arc<[Dated]>> {
    let claude = claude_id(table, id)?;
    let entries = table.by_model.get(claude.model)?;
    if entries.first()?.from < current_from() {
        return None;
    }
    if claude.geo == Some("global") {
        return Some(entries.clone());
    }
    Some(
        entries
            .iter()
            .map(|d| Dated {
                prices: d.prices.scaled(REGIONAL_PERMILLE),
                ..*d
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::price_table::bundled;
    use crate::config::Provider;
    use crate::quota::pricing::Prices;

    #[test]
    fn a_bedrock_id_names_its_bundled_claude_model_with_any_profile_prefix() {
        let t = bundled();
        let id = |geo, model| Some(ClaudeId { geo, model });
        let sonnet = "claude-sonnet-4-5";
        for (geo, prefix) in [
            (None, ""),
            (Some("us"), "us."),
            (Some("eu"), "eu."),
            (Some("apac"), "apac."),
            (Some("jp"), "jp."),
            (Some("au"), "au."),
            (Some("in"), "in."),
            (Some("global"), "global."),
        ] {
            for rest in [
                "anthropic.claude-sonnet-4-5-20250929-v1:0",
                "anthropic.claude-sonnet-4-5-v1:0",
                "anthropic.claude-sonnet-4-5-20250929-v2:1",
                "anthropic.claude-sonnet-4-5-v1",
                "anthropic.claude-sonnet-4-5",
            ] {
                let full = format!("{prefix}{rest}");
                assert_eq!(claude_id(t, &full), id(geo, sonnet), "{full}");
            }
        }
        // Claude 4.6's ids as Anthropic lists them: no date, `-v1` or no version at all.
        assert_eq!(
            claude_id(t, "global.anthropic.claude-opus-4-6-v1"),
            id(Some("global"), "claude-opus-4-6")
        );
        assert_eq!(
            claude_id(t, "anthropic.claude-sonnet-4-6"),
            id(None, "claude-sonnet-4-6")
        );
        // The most specific name: Sonnet 4 is not Sonnet 4.5, Haiku 4.5 is not 3.5 Haiku.
        assert_eq!(
            claude_id(t, "us.anthropic.claude-sonnet-4-20250514-v1:0"),
            id(Some("us"), "claude-sonnet-4")
        );
        assert_eq!(
            claude_id(t, "anthropic.claude-haiku-4-5-20251001-v1:0"),
            id(None, "claude-haiku-4-5")
        );
    }

    #[test]
    fn anything_but_a_well_formed_id_of_a_bundled_claude_model_is_not_one() {
        let t = bundled();
        for not in [
            "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-sonnet-4-5-20250929-v1:0",
            "arn:aws:bedrock:us-east-1:1:application-inference-profile/a",
            "amazon.nova-premier-v1:0",
            "us.amazon.nova-pro-v1:0",
            "meta.llama3-70b-instruct-v1:0",
            // A Claude the table does not hold, or holds under another spelling.
            "anthropic.claude-opus-4-7-v1",
            "anthropic.claude-sonnet-4.5-20250929-v1:0",
            "anthropic.claude-instant-v1",
            // Malformed around a bundled name.
            "claude-sonnet-4-5-20250929-v1:0",
            "anthropic.claude-sonnet-4-5-20250929-v1:",
            "anthropic.claude-sonnet-4-5-20250929-v:0",
            "anthropic.claude-sonnet-4-5-20250929-vx",
            "anthropic.claude-sonnet-4-5-20250929:0",
            "anthropic.claude-sonnet-4-5-custom-v1:0",
            "anthropic.claude-sonnet-4-5-2025092-v1:0",
            "Anthropic.claude-sonnet-4-5-v1:0",
            "US.anthropic.claude-sonnet-4-5-v1:0",
            "ca.anthropic.claude-sonnet-4-5-v1:0",
            "us-gov.anthropic.claude-sonnet-4-5-v1:0",
            "us.us.anthropic.claude-sonnet-4-5-v1:0",
            "global.",
            "",
            // An OpenAI or Gemini model behind the prefix is not Anthropic's.
            "anthropic.gpt-4o",
            "anthropic.gemini-2.5-pro",
        ] {
            assert_eq!(claude_id(t, not), None, "{not}");
            assert!(prices(t, not).is_none(), "{not}");
        }
    }

    /// On `global.` the bundled entries as they are; elsewhere every rate × 1.1, rounded
    /// up; Claude before 4.5 not at all.
    #[test]
    fn claude_4_5_and_later_is_at_the_list_price_globally_and_1_1_times_it_elsewhere() {
        let t = bundled();
        let list = t.for_upstream_model("claude-sonnet-4-5");
        assert_eq!(
            prices(t, "global.anthropic.claude-sonnet-4-5-20250929-v1:0").as_deref(),
            Some(&*list)
        );
        let regional = Prices {
            cached_input: 330_000,
            cache_write_5m: 4_125_000,
            cache_write_1h: 6_600_000,
            web_search_per_1k_calls: 11_000_000,
            ..Prices::plain(3_300_000, 16_500_000)
        };
        for id in [
            "anthropic.claude-sonnet-4-5-20250929-v1:0",
            "us.anthropic.claude-sonnet-4-5-20250929-v1:0",
            "apac.anthropic.claude-sonnet-4-5-20250929-v1:0",
        ] {
            let p = prices(t, id).unwrap_or_else(|| panic!("{id}"));
            assert_eq!(p.len(), list.len(), "{id}");
            assert_eq!((p[0].from, p[0].stated), (list[0].from, list[0].stated));
            assert_eq!(p[0].prices, regional, "{id}");
        }
        // Every kind: Haiku 5.5's 0.125 USD 5-minute write is 0.1375, its 0.01 cache read
        // 0.011 (no bundled rate × 1.1 leaves a fraction of a micro-dollar: the rounding
        // up is `pricing::tests::a_price_scaled_is_rounded_up_per_rate`).
        let h55 = &prices(t, "eu.anthropic.claude-haiku-5-5-v1").unwrap()[0].prices;
        assert_eq!(
            (h55.input, h55.cached_input, h55.cache_write_5m, h55.output),
            (110_000, 11_000, 137_500, 550_000)
        );
        for before in [
            "anthropic.claude-sonnet-4-20250514-v1:0",
            "global.anthropic.claude-sonnet-4-20250514-v1:0",
            "us.anthropic.claude-opus-4-1-20250805-v1:0",
            "anthropic.claude-3-5-sonnet-20241022-v2:0",
            "anthropic.claude-3-haiku-20240307-v1:0",
        ] {
            assert!(claude_id(t, before).is_some(), "{before}");
            assert!(prices(t, before).is_none(), "{before}");
        }
    }

    /// The Region a Bedrock upstream is priced in: a non-commercial one named by either its
    /// `region` or its URL's host wins (a GovCloud endpoint under a commercial `region`).
    #[test]
    fn the_billing_region_is_a_non_commercial_one_of_region_and_url() {
        let url = |r: &str| format!("https://bedrock-runtime.{r}.amazonaws.com");
        assert_eq!(
            billing_region(Some("us-east-1"), &url("us-east-1")),
            Some("us-east-1")
        );
        assert_eq!(
            billing_region(Some("us-east-1"), &url("us-gov-west-1")),
            Some("us-gov-west-1")
        );
        assert_eq!(
            billing_region(
                Some("us-east-1"),
                "https://bedrock-runtime-fips.us-gov-east-1.amazonaws.com/"
            ),
            Some("us-gov-east-1")
        );
        assert_eq!(
            billing_region(Some("cn-north-1"), &url("us-east-1")),
            Some("cn-north-1")
        );
        assert_eq!(billing_region(None, "https://proxy.example/bedrock"), None);
        // In capitals, as DNS takes it (final attack #4).
        let shouted = billing_region(
            Some("us-east-1"),
            "https://BEDROCK-RUNTIME.US-GOV-WEST-1.AMAZONAWS.COM",
        );
        assert!(!commercial(shouted.unwrap()), "{shouted:?}");
        assert!(!commercial("US-GOV-WEST-1"));
        for r in [
            "us-iso-east-1",
            "us-isob-east-1",
            "us-isof-south-1",
            "eu-isoe-west-1",
            "eusc-de-east-1",
        ] {
            assert!(!commercial(r), "{r}");
        }
        for r in [
            "us-east-1",
            "eu-central-1",
            "ap-southeast-2",
            "il-central-1",
            "mx-central-1",
        ] {
            assert!(commercial(r), "{r}");
        }
    }

    /// Only a `bedrock` route reads the name as Bedrock's id: an `anthropic.`-named model
    /// on another provider matches as it did (by its name, here nothing).
    #[test]
    fn only_a_bedrock_route_is_priced_by_its_bedrock_id() {
        let t = bundled();
        let id = "us.anthropic.claude-sonnet-4-5-20250929-v1:0";
        assert_eq!(
            t.for_route(id, Provider::Bedrock, None)[0].prices.input,
            3_300_000
        );
        for p in [
            Provider::Anthropic,
            Provider::OpenaiCompatible,
            Provider::Openai,
            Provider::AzureOpenai,
            Provider::Gemini,
        ] {
            assert!(t.for_route(id, p, None).is_empty(), "{p:?}");
        }
        // A bundled name on Bedrock matches as it always did.
        assert_eq!(
            t.for_route("claude-sonnet-4-5", Provider::Bedrock, None),
            t.for_upstream_model("claude-sonnet-4-5")
        );
        assert!(t
            .for_route("amazon.nova-premier-v1:0", Provider::Bedrock, None)
            .is_empty());
    }
}

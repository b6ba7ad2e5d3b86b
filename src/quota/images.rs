//! What the images of a request may cost in input tokens on the upstream that reads them.
//! The token estimate counts every image at one flat figure (`estimate::PER_IMAGE`), which
//! is what rate windows and the context check use; the money path adds, per route, what the
//! route's provider may bill beyond it (`Images::beyond_estimate`): each provider turns an
//! image into tokens by its own rule from the image's size, which is read from the image's
//! header where the image is sent inline (`data:` URL or base64 source) and taken at the
//! rule's largest figure where it is not (an image by URL, an unreadable header).

use base64::Engine;
use serde_json::{Map, Value};

use crate::config::Provider;

use super::estimate::PER_IMAGE;
use super::parts;

/// One image of a request: its size in pixels where its header could be read, and whether
/// the client asked for OpenAI's low detail (`detail: "low"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Image {
    size: Option<(u32, u32)>,
    low_detail: bool,
}

/// The images of a request; empty (no allocation) for a request without any.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Images(Vec<Image>);

/// How a provider's model turns an image into input tokens (each provider's vision
/// documentation; `docs/DESIGN.md` "Images" lists the figures).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// Claude: `⌈w × h / 750⌉` after the long edge is brought to 1 568 px; at most 1 600.
    Claude,
    /// OpenAI's tile models: `base` plus `tile` per 512 px tile once the image fits
    /// 2 048 × 2 048 and its short side is at most 768 px; `base` alone at low detail.
    Tiles { base: i64, tile: i64 },
    /// OpenAI's patch models: one token per 32 px patch, at most 1 536 patches, times the
    /// model's multiplier in thousandths.
    Patches { milli: i64 },
    /// Gemini: 258 tokens an image of at most 384 px a side, else 258 per 768 px tile; at
    /// least 1 120 (Gemini 3's default media resolution) and at most a 3 072 px square.
    Gemini,
    /// A model none of the above names: the largest of them for the image.
    Unknown,
}

/// Base64 characters of an inline image decoded to read its size: a PNG, GIF or WebP
/// header is in the first bytes; a JPEG's size follows its metadata, which can be long.
const HEADER_CHARS: usize = 256 * 1024;

impl Images {
    /// The images at the content-block positions of a request body (`parts`): OpenAI
    /// `image_url` / `input_image` parts and Anthropic `image` blocks — the parts
    /// `estimate::count_message` counts at `PER_IMAGE`. An image-shaped object elsewhere is
    /// text to the provider and to the estimate.
    ///
    /// An inline image whose declared media type is no image's (`data:application/pdf…`, an
    /// Anthropic source's `media_type: "text/plain"`) is refused: the estimate counts it as
    /// one image, while a provider that reads what the type says — Gemini, and whatever
    /// relays a data URL to it — bills a document's pages (s27 translated money #1 closed
    /// this on native Gemini routes only; s28 diff attack F5). OpenAI and Anthropic refuse
    /// such a part themselves.
    pub fn read(body: &Map<String, Value>) -> Result<Images, NotAnImage> {
        let mut out = Vec::new();
        let mut refused = None;
        parts::each(body, &mut |part| {
            if refused.is_none() && parts::is_image(part) {
                match declared_type(part).filter(|t| !is_image_type(t)) {
                    Some(t) => refused = Some(NotAnImage(t.chars().take(64).collect())),
                    None => out.push(image(part)),
                }
            }
        });
        match refused {
            Some(e) => Err(e),
            None => Ok(Images(out)),
        }
    }

    /// Tokens the images may cost under `rule` beyond the flat figure the estimate already
    /// counted for each; never negative, so a cheap image never lowers the estimate.
    pub fn beyond_estimate(&self, rule: Rule) -> i64 {
        self.0
            .iter()
            .map(|i| (rule.tokens(*i) - PER_IMAGE).max(0))
            .sum()
    }
}

/// Reads one image part: chat `{"image_url": {"url", "detail"}}`, Responses
/// `{"image_url": "…", "detail"}`, Anthropic `{"source": {"type": "base64", "data"}}`.
fn image(part: &Map<String, Value>) -> Image {
    let nested = part.get("image_url").and_then(Value::as_object);
    let detail = nested
        .and_then(|u| u.get("detail"))
        .or_else(|| part.get("detail"))
        .and_then(Value::as_str);
    let data = match part.get("image_url") {
        Some(Value::String(url)) => data_url(url),
        Some(Value::Object(u)) => u.get("url").and_then(Value::as_str).and_then(data_url),
        _ => part
            .get("source")
            .filter(|s| s.get("type").and_then(Value::as_str) == Some("base64"))
            .and_then(|s| s.get("data"))
            .and_then(Value::as_str),
    };
    Image {
        size: data.and_then(size_of),
        low_detail: detail == Some("low"),
    }
}

/// An inline image part whose declared media type is not an image's; the type, cut to 64
/// characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotAnImage(pub String);

/// The media type an inline image part declares: a `data:` URL's, a base64 source's
/// `media_type`; `None` where it names none (the provider judges the bytes) and for an
/// image by URL or file id, whose type the provider learns from what it fetches.
///
/// A `data:` URL is read wherever a URL may stand — an Anthropic `url` source too, which a
/// translation sends on as an `image_url` data URL — and after leading whitespace, which a
/// relay may trim (s28 late attack F5: both passed as images by URL).
fn declared_type(part: &Map<String, Value>) -> Option<&str> {
    let source = part.get("source");
    let kind = |k: &str| source.filter(|s| s.get("type").and_then(Value::as_str) == Some(k));
    let url = match part.get("image_url") {
        Some(Value::String(url)) => Some(url.as_str()),
        Some(Value::Object(u)) => u.get("url").and_then(Value::as_str),
        // Only a `url` source's: a stray `url` beside a base64 source's `media_type` hid it
        // (s28 final attack #1).
        _ => kind("url")
            .and_then(|s| s.get("url"))
            .and_then(Value::as_str),
    };
    let declared = match url.map(str::trim_start) {
        Some(url) => {
            let rest = url
                .get(5..)
                .filter(|_| url[..5].eq_ignore_ascii_case("data:"))?;
            rest.split([';', ',']).next()
        }
        None => kind("base64")
            .and_then(|s| s.get("media_type"))
            .and_then(Value::as_str),
    };
    declared.map(str::trim).filter(|t| !t.is_empty())
}

fn is_image_type(t: &str) -> bool {
    t.get(..6).is_some_and(|p| p.eq_ignore_ascii_case("image/"))
}

fn data_url(url: &str) -> Option<&str> {
    url.strip_prefix("data:")?
        .split_once(";base64,")
        .map(|(_, d)| d)
}

/// The size in an image's header, from the first `HEADER_CHARS` of its base64 text.
fn size_of(b64: &str) -> Option<(u32, u32)> {
    let take = b64.len().min(HEADER_CHARS) / 4 * 4;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64.get(..take)?)
        .ok()?;
    let s = imagesize::blob_size(&bytes).ok()?;
    let (w, h) = (u32::try_from(s.width).ok()?, u32::try_from(s.height).ok()?);
    (w > 0 && h > 0).then_some((w, h))
}

impl Rule {
    /// The rule of a route: by its provider (Anthropic's API serves only Claude), else by
    /// the model names it goes by — the route's model (on Azure, not the deployment's
    /// name), the upstream's, then the gateway's; the first a family is known by decides.
    pub fn of(provider: Provider, names: &[&str]) -> Rule {
        if provider == Provider::Anthropic {
            return Rule::Claude;
        }
        names
            .iter()
            .map(|n| by_name(bare(&n.to_ascii_lowercase())))
            .find(|r| *r != Rule::Unknown)
            .unwrap_or(if provider == Provider::Gemini {
                Rule::Gemini
            } else {
                Rule::Unknown
            })
    }

    fn tokens(self, image: Image) -> i64 {
        let size = image.size;
        match self {
            Rule::Claude => size.map_or(1_600, |(w, h)| {
                let (w, h) = fit(w, h, 1_568);
                ceil_div(w * h, 750).min(1_600)
            }),
            Rule::Tiles { base, .. } if image.low_detail => base,
            Rule::Tiles { base, tile } => {
                let tiles = size.map_or(8, |(w, h)| {
                    let (w, h) = fit(w, h, 2_048);
                    let scale = (768.0 / w.min(h) as f64).min(1.0);
                    let (w, h) = (w as f64 * scale, h as f64 * scale);
                    ((w / 512.0).ceil() * (h / 512.0).ceil()) as i64
                });
                base + tile * tiles
            }
            Rule::Patches { milli } => {
                let patches = size.map_or(1_536, |(w, h)| {
                    (ceil_div(i64::from(w), 32) * ceil_div(i64::from(h), 32)).min(1_536)
                });
                ceil_div(patches * milli, 1_000)
            }
            Rule::Gemini => size.map_or(16 * 258, |(w, h)| {
                let (w, h) = fit(w, h, 3_072);
                let tiles = if w <= 384 && h <= 384 {
                    1
                } else {
                    ceil_div(w, 768) * ceil_div(h, 768)
                };
                (tiles * 258).max(1_120)
            }),
            Rule::Unknown => [
                Rule::Claude,
                Rule::Tiles {
                    base: 85,
                    tile: 170,
                },
                Rule::Patches { milli: 2_460 },
                Rule::Gemini,
            ]
            .into_iter()
            .map(|r| r.tokens(image))
            .max()
            .unwrap_or(0),
        }
    }
}

/// `⌈a / b⌉` for a non-negative `a` and a positive `b`.
fn ceil_div(a: i64, b: i64) -> i64 {
    (a + b - 1) / b
}

/// `(w, h)` scaled down (never up) so the long edge is at most `edge`, as i64.
fn fit(w: u32, h: u32, edge: u32) -> (i64, i64) {
    let (w, h) = (i64::from(w), i64::from(h));
    let long = w.max(h);
    if long <= i64::from(edge) {
        return (w, h);
    }
    let e = i64::from(edge);
    ((w * e / long).max(1), (h * e / long).max(1))
}

/// A model name without what routers and fine-tunes put around it: `openai/gpt-4o-mini`
/// (OpenRouter, LiteLLM) and `ft:gpt-4o-mini-2024-07-18:org::id` are `gpt-4o-mini…`.
fn bare(name: &str) -> &str {
    let name = name.strip_prefix("ft:").unwrap_or(name);
    name.rsplit('/').next().unwrap_or(name)
}

/// OpenAI's and Google's model families by name; more specific names first.
fn by_name(name: &str) -> Rule {
    // gpt-4.1 and gpt-5 (5.1, …) minis and nanos bill by patches whatever their version.
    if name.starts_with("gpt-4.1") || name.starts_with("gpt-5") {
        if name.contains("-nano") {
            return Rule::Patches { milli: 2_460 };
        }
        if name.contains("-mini") {
            return Rule::Patches { milli: 1_620 };
        }
    }
    const PATCHES: &[(&str, i64)] = &[("o4-mini", 1_720)];
    const TILES_85: &[&str] = &[
        "gpt-4o",
        "chatgpt-4o",
        "gpt-4.1",
        "gpt-4.5",
        "gpt-4-turbo",
        "o1",
        "o3",
    ];
    if name.contains("claude") {
        return Rule::Claude;
    }
    if name.starts_with("gemini") {
        return Rule::Gemini;
    }
    if let Some((_, milli)) = PATCHES.iter().find(|(p, _)| name.starts_with(p)) {
        return Rule::Patches { milli: *milli };
    }
    if name.starts_with("gpt-4o-mini") {
        return Rule::Tiles {
            base: 2_833,
            tile: 5_667,
        };
    }
    if name.starts_with("gpt-5") {
        return Rule::Tiles {
            base: 70,
            tile: 140,
        };
    }
    if TILES_85.iter().any(|p| name.starts_with(p)) {
        return Rule::Tiles {
            base: 85,
            tile: 170,
        };
    }
    Rule::Unknown
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A PNG's signature and header chunk: all `imagesize` reads (the CRC is not checked).
    fn png(w: u32, h: u32) -> String {
        let mut b = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
        b.extend(w.to_be_bytes());
        b.extend(h.to_be_bytes());
        b.extend([8, 2, 0, 0, 0, 0, 0, 0, 0]);
        base64::engine::general_purpose::STANDARD.encode(b)
    }

    fn one(part: Value) -> Image {
        let body = json!({"messages": [{"role": "user", "content": [part]}]});
        let Images(v) = Images::read(body.as_object().unwrap()).unwrap();
        assert_eq!(v.len(), 1);
        v[0]
    }

    /// An inline image that declares a type no image has is refused, in every client's
    /// shape; one that declares none, or comes by URL, is read as an image.
    #[test]
    fn an_inline_image_declaring_another_type_is_refused() {
        let read = |part: Value| {
            let body = json!({"messages": [{"role": "user", "content": [part]}]});
            Images::read(body.as_object().unwrap()).map(|Images(v)| v.len())
        };
        let refused = |t: &str| Err(NotAnImage(t.into()));
        assert_eq!(
            read(json!({"type": "image_url",
                "image_url": {"url": "data:application/pdf;base64,JVBERi0="}})),
            refused("application/pdf")
        );
        assert_eq!(
            read(json!({"type": "input_image", "image_url": "DATA:text/plain,hello"})),
            refused("text/plain")
        );
        assert_eq!(
            read(json!({"type": "image", "source": {"type": "base64",
                "media_type": "audio/wav", "data": "UklGRg=="}})),
            refused("audio/wav")
        );
        // A data URL in an Anthropic `url` source, or after whitespace (s28 late attack F5).
        assert_eq!(
            read(json!({"type": "image", "source": {"type": "url",
                "url": "data:application/pdf;base64,JVBERi0="}})),
            refused("application/pdf")
        );
        assert_eq!(
            read(json!({"type": "image_url", "image_url": {"url": " \tdata:text/plain,hi"}})),
            refused("text/plain")
        );
        // A stray `url` beside a base64 source's type hides nothing (s28 final attack #1).
        assert_eq!(
            read(json!({"type": "image", "source": {"type": "base64",
                "media_type": "application/pdf", "url": "https://x/y.png", "data": "JVBERi0="}})),
            refused("application/pdf")
        );
        for fine in [
            json!({"type": "image_url", "image_url": {"url": "data:IMAGE/PNG;base64,iVBORw0KGgo="}}),
            json!({"type": "image_url", "image_url": {"url": "data:;base64,iVBORw0KGgo="}}),
            json!({"type": "image_url", "image_url": {"url": "https://x/book.pdf"}}),
            json!({"type": "image", "source": {"type": "base64", "data": "iVBORw0KGgo="}}),
            json!({"type": "image", "source": {"type": "url", "url": "https://x/y.pdf"}}),
        ] {
            assert_eq!(read(fine.clone()), Ok(1), "{fine}");
        }
    }

    #[test]
    fn sizes_are_read_from_every_clients_inline_images() {
        let d = png(2048, 768);
        let chat = one(json!({"type": "image_url",
            "image_url": {"url": format!("data:image/png;base64,{d}"), "detail": "low"}}));
        assert_eq!((chat.size, chat.low_detail), (Some((2048, 768)), true));
        let responses =
            one(json!({"type": "input_image", "image_url": format!("data:image/png;base64,{d}")}));
        assert_eq!(responses.size, Some((2048, 768)));
        let anthropic = one(json!({"type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": d}}));
        assert_eq!(anthropic.size, Some((2048, 768)));
        // By URL, or a header that does not parse: no size, the rule's largest figure.
        let by_url = one(json!({"type": "image_url", "image_url": {"url": "https://x/y.png"}}));
        assert_eq!(by_url.size, None);
        let broken =
            one(json!({"type": "image", "source": {"type": "base64", "data": "iVBORw0KGgo="}}));
        assert_eq!(broken.size, None);
        // Anthropic by URL or by an uploaded file's id: no size either.
        for source in [
            json!({"type": "url", "url": "https://x/y.png"}),
            json!({"type": "file", "file_id": "file_011"}),
        ] {
            assert_eq!(one(json!({"type": "image", "source": source})).size, None);
        }
    }

    #[test]
    fn each_rule_prices_an_image_as_its_provider_documents() {
        let at = |rule: Rule, size, low_detail| rule.tokens(Image { size, low_detail });
        // Claude: 1 000 × 1 000 is 1 334; 4 000 × 3 000 comes down to 1 568 × 1 176.
        assert_eq!(at(Rule::Claude, Some((1000, 1000)), false), 1_334);
        assert_eq!(at(Rule::Claude, Some((4000, 3000)), false), 1_600);
        assert_eq!(at(Rule::Claude, None, false), 1_600);
        // gpt-4o: 1 024² → 768² → 4 tiles; 2 048 × 4 096 → 768 × 1 536 → 6 tiles.
        let gpt4o = Rule::of(Provider::Openai, &["gpt-4o-2024-08-06"]);
        assert_eq!(at(gpt4o, Some((1024, 1024)), false), 765);
        assert_eq!(at(gpt4o, Some((2048, 4096)), false), 1_105);
        assert_eq!(at(gpt4o, Some((2048, 4096)), true), 85);
        assert_eq!(at(gpt4o, None, false), 85 + 8 * 170);
        let mini = Rule::of(Provider::AzureOpenai, &["prod-deployment", "gpt-4o-mini"]);
        assert_eq!(at(mini, Some((2048, 768)), false), 2_833 + 8 * 5_667);
        // Behind a router's vendor prefix, as a fine-tune, or named by the route's model.
        for names in [
            &["openai/gpt-4o-mini"][..],
            &["ft:gpt-4o-mini-2024-07-18:org::abc"],
            &["gpt-4o-mini", "prod-east", "fast"],
        ] {
            let rule = Rule::of(Provider::OpenaiCompatible, names);
            assert_eq!(at(rule, None, false), 2_833 + 8 * 5_667, "{names:?}");
        }
        // A later gpt-5's mini bills by patches, not by the gpt-5 tiles.
        assert_eq!(
            Rule::of(Provider::Openai, &["gpt-5.1-mini"]),
            Rule::Patches { milli: 1_620 }
        );
        // gpt-4.1-mini: 1 024² is 1 024 patches × 1.62; past 1 536 patches, 1 536.
        let patches = Rule::of(Provider::Openai, &["gpt-4.1-mini"]);
        assert_eq!(at(patches, Some((1024, 1024)), false), 1_659);
        assert_eq!(at(patches, Some((1800, 2400)), false), 2_489);
        // Gemini: small images one tile, at least 1 120; big ones 258 a tile.
        let gemini = Rule::of(Provider::Gemini, &["gemini-2.5-pro"]);
        assert_eq!(at(gemini, Some((300, 300)), false), 1_120);
        assert_eq!(at(gemini, Some((3072, 3072)), false), 16 * 258);
        // Unknown: the largest of the rules.
        let unknown = Rule::of(Provider::OpenaiCompatible, &["llava"]);
        assert_eq!(unknown, Rule::Unknown);
        assert_eq!(at(unknown, None, false), 16 * 258);
        assert_eq!(Rule::of(Provider::Anthropic, &["x"]), Rule::Claude);
        assert_eq!(
            Rule::of(Provider::Bedrock, &["anthropic.claude-sonnet-4"]),
            Rule::Claude
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(4_000))]
        /// Hostile bytes behind every format's signature: a size or none, never a panic
        /// (a header a client controls must not take a worker down), and every rule's
        /// figure for any size is positive and at most its largest.
        #[test]
        fn any_header_is_read_without_a_panic(
            magic in 0usize..8,
            tail in proptest::collection::vec(proptest::num::u8::ANY, 0..300),
            w in 1u32..=u32::MAX,
            h in 1u32..=u32::MAX,
        ) {
            const MAGIC: [&[u8]; 8] = [b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF89a",
                b"RIFF\0\0\0\0WEBP", b"BM", b"\0\0\x01\0", b"8BPS", b"\0\0\0\x0cjP  "];
            let mut bytes = MAGIC[magic].to_vec();
            bytes.extend(tail);
            let _ = size_of(&base64::engine::general_purpose::STANDARD.encode(bytes));
            for rule in [Rule::Claude, Rule::Tiles { base: 2_833, tile: 5_667 },
                Rule::Patches { milli: 2_460 }, Rule::Gemini, Rule::Unknown] {
                let sized = rule.tokens(Image { size: Some((w, h)), low_detail: false });
                let largest = rule.tokens(Image { size: None, low_detail: false });
                proptest::prop_assert!(sized > 0 && sized <= largest, "{rule:?} {w}×{h}: {sized} > {largest}");
            }
        }
    }

    #[test]
    fn only_what_a_rule_adds_past_the_flat_estimate_is_added() {
        let d = png(100, 100);
        let body = json!({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{d}")}},
            {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}]});
        let images = Images::read(body.as_object().unwrap()).unwrap();
        // Claude: the small image is under the flat figure (nothing added), the other 1 600.
        assert_eq!(images.beyond_estimate(Rule::Claude), 1_600 - PER_IMAGE);
        assert_eq!(Images::default().beyond_estimate(Rule::Unknown), 0);
    }

    #[test]
    fn an_image_shape_outside_the_content_is_no_image() {
        let shaped = json!({"type": "image_url", "image_url": {"url": "https://x/y.png"}});
        let body = json!({"tools": [{"parameters": {"default": shaped}}], "messages": [
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": shaped}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                "content": [{"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}]}]}]});
        let Images(v) = Images::read(body.as_object().unwrap()).unwrap();
        assert_eq!(v.len(), 1, "only the tool result's image");
    }
}

//! `[tracing]`: OpenTelemetry traces exported over OTLP/HTTP (`ops::traces`). Off unless
//! `otlp_endpoint` is set; read once at start (SIGHUP does not apply it).

use serde::{Deserialize, Serialize};

use super::ConfigError;

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct TracingSettings {
    /// The collector's OTLP/HTTP base URL (`http://collector:4318`): spans are posted to
    /// its `/v1/traces`. Absent, tracing is off and costs nothing on the request path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub otlp_endpoint: Option<String>,
    /// The share of new traces recorded, 0.0–1.0, decided by trace id; a client's
    /// `traceparent` decides for its own trace (its sampled flag).
    pub sample_ratio: f64,
    /// `service.name` on every span.
    pub service_name: String,
}

impl Default for TracingSettings {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            sample_ratio: 1.0,
            service_name: "sluice".into(),
        }
    }
}

impl TracingSettings {
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |m: &str| Err(ConfigError::Invalid(format!("tracing.{m}")));
        // `contains` is false for NaN too.
        if !(0.0..=1.0).contains(&self.sample_ratio) {
            return invalid("sample_ratio must be between 0.0 and 1.0");
        }
        if self.service_name.trim().is_empty() {
            return invalid("service_name must not be empty");
        }
        if let Some(endpoint) = &self.otlp_endpoint {
            let ok = url::Url::parse(endpoint)
                .is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.has_host());
            if !ok {
                return invalid("otlp_endpoint must be an http:// or https:// URL");
            }
        }
        Ok(())
    }

    /// Where spans are posted: the base URL's `/v1/traces` (as the OTLP exporters' own
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` is read).
    pub fn traces_url(&self) -> Option<String> {
        let base = self.otlp_endpoint.as_deref()?;
        Some(format!("{}/v1/traces", base.trim_end_matches('/')))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(endpoint: Option<&str>, ratio: f64) -> TracingSettings {
        TracingSettings {
            otlp_endpoint: endpoint.map(String::from),
            sample_ratio: ratio,
            ..TracingSettings::default()
        }
    }

    #[test]
    fn off_by_default_and_the_ratio_is_checked() {
        let d = TracingSettings::default();
        assert!(d.otlp_endpoint.is_none() && d.validate().is_ok());
        assert_eq!((d.sample_ratio, d.service_name.as_str()), (1.0, "sluice"));
        for bad in [-0.1, 1.5, f64::NAN] {
            assert!(
                with(Some("http://c:4318"), bad).validate().is_err(),
                "{bad}"
            );
        }
        assert!(with(Some("http://c:4318"), 0.0).validate().is_ok());
        assert!(with(Some("collector:4318"), 1.0).validate().is_err());
        assert!(with(Some("ftp://c"), 1.0).validate().is_err());
    }

    #[test]
    fn spans_go_to_the_base_urls_v1_traces() {
        assert_eq!(
            with(Some("http://c:4318/"), 1.0).traces_url().as_deref(),
            Some("http://c:4318/v1/traces")
        );
        assert_eq!(with(None, 1.0).traces_url(), None);
    }
}

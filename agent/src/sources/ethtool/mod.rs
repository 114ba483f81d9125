//! ethtool source (skeleton; being filled in).
use prometheus_client::registry::Registry;

use super::{Source, SourceContext, SourceError, SweepReport};

pub struct EthtoolSource {
    #[allow(dead_code)]
    ctx: SourceContext,
}

impl EthtoolSource {
    pub fn new(ctx: SourceContext, _registry: &mut Registry) -> Self {
        EthtoolSource { ctx }
    }
}

impl Source for EthtoolSource {
    fn name(&self) -> &'static str {
        "ethtool"
    }
    fn sweep(&mut self) -> Result<SweepReport, SourceError> {
        Ok(SweepReport::default())
    }
    fn status(&self) -> serde_json::Value {
        serde_json::json!({})
    }
}

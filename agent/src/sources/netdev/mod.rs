//! netdev source (skeleton; being filled in).
use prometheus_client::registry::Registry;

use super::{Source, SourceContext, SourceError, SweepReport};

pub struct NetdevSource {
    #[allow(dead_code)]
    ctx: SourceContext,
}

impl NetdevSource {
    pub fn new(ctx: SourceContext, _registry: &mut Registry) -> Self {
        NetdevSource { ctx }
    }
}

impl Source for NetdevSource {
    fn name(&self) -> &'static str {
        "netdev"
    }
    fn sweep(&mut self) -> Result<SweepReport, SourceError> {
        Ok(SweepReport::default())
    }
    fn status(&self) -> serde_json::Value {
        serde_json::json!({})
    }
}

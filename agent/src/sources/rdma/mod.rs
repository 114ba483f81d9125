//! rdma source (skeleton; being filled in).
use prometheus_client::registry::Registry;

use super::{Source, SourceContext, SourceError, SweepReport};

pub struct RdmaSource {
    #[allow(dead_code)]
    ctx: SourceContext,
}

impl RdmaSource {
    pub fn new(ctx: SourceContext, _registry: &mut Registry) -> Self {
        RdmaSource { ctx }
    }
}

impl Source for RdmaSource {
    fn name(&self) -> &'static str {
        "rdma"
    }
    fn sweep(&mut self) -> Result<SweepReport, SourceError> {
        Ok(SweepReport::default())
    }
    fn status(&self) -> serde_json::Value {
        serde_json::json!({})
    }
}

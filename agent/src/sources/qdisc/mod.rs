//! qdisc source (skeleton; being filled in).
use prometheus_client::registry::Registry;

use super::{Source, SourceContext, SourceError, SweepReport};

pub struct QdiscSource {
    #[allow(dead_code)]
    ctx: SourceContext,
}

impl QdiscSource {
    pub fn new(ctx: SourceContext, _registry: &mut Registry) -> Self {
        QdiscSource { ctx }
    }
}

impl Source for QdiscSource {
    fn name(&self) -> &'static str {
        "qdisc"
    }
    fn sweep(&mut self) -> Result<SweepReport, SourceError> {
        Ok(SweepReport::default())
    }
    fn status(&self) -> serde_json::Value {
        serde_json::json!({})
    }
}

//! `agent.toml`: any text is either a configuration or a typed error, and a configuration
//! either validates or names the key that is wrong. Nothing panics, a token never appears in
//! an error, and what validates survives a print/parse round trip (`--print-default-config`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use stepwise::config::{Config, ConfigError};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(cfg) = Config::from_toml(text) else { return };
    match cfg.validate() {
        Ok(()) => {
            let printed = toml::to_string(&cfg).expect("a valid config prints");
            let mut back = Config::from_toml(&printed).unwrap_or_else(|e| panic!("printed config does not parse: {e}\n{printed}"));
            let mut want = cfg.clone();
            // The token prints redacted by design.
            back.api.token = None;
            want.api.token = None;
            assert_eq!(back, want, "round trip of\n{printed}");
        }
        Err(e) => {
            assert!(!e.to_string().is_empty());
            // An error about the token never quotes it.
            if let ConfigError::Invalid { field, value, .. } = &e {
                if field.starts_with("api.") {
                    assert!(value == "<redacted>" || value == "true", "{field} = {value}");
                }
            }
        }
    }
});

//! The committed JSON Schema must be what the code generates.
//!
//! `cargo xtask schema` (which sets `JOBS_UPDATE_SCHEMA=1`) rewrites the file instead.

use std::path::Path;

#[test]
fn committed_envelope_schema_is_fresh() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("schema/envelope.schema.json");
    let mut generated =
        serde_json::to_string_pretty(&jobs_core::schema::envelope()).expect("a Value serialises");
    generated.push('\n');
    if std::env::var_os("JOBS_UPDATE_SCHEMA").is_some() {
        std::fs::write(&path, &generated).expect("write the schema file");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "{} is stale: run `cargo xtask schema` and commit the result",
        path.display()
    );
}

//! `sqlx::migrate!` embeds `migrations/` at compile time, but cargo does not see a file added
//! there: rebuild whenever the folder changes, so a new migration is never left out.

fn main() {
    println!("cargo:rerun-if-changed=migrations");
}

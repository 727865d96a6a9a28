//! The PostgreSQL adapter against a real PostgreSQL: the store contract suite, the tenant
//! directory and partition pre-creation. One test binary, one shared database helper.

mod db;
mod partitions;
mod store;
mod tenants;

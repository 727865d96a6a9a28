-- Why each dead letter became one (`poison`, `unknown_kind`, `permanent`, `exhausted`, ...);
-- rows from before the column have none ("not recorded"). Added once: the migrator records it.
alter table dead_letters add column reason text;

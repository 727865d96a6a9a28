-- The queue's keys compare as bytes (ADR 0011). `queue` and `dedup_key` are identifiers, only
-- ever compared for equality or grouped, so the database's linguistic collation buys nothing
-- and costs every batch insert's unique check and every fetch's index descent (5-20% of a
-- batch publish, measured). Equality, hence the dedup constraint, is unchanged: a
-- deterministic collation holds two strings equal only when they are identical.
-- The two indexes on these columns are rebuilt; the table is not rewritten.
alter table core.jobs
    alter column queue type text collate "C",
    alter column dedup_key type text collate "C";

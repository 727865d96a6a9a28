-- Why each dead letter became one (`poison`, `unknown_kind`, `permanent`, `exhausted`,
-- `too_large`, `unforwardable`), so that a review tells "refused at once" from "ran out of
-- retries" and can filter by it. Rows from before the column have none ("not recorded").
-- Free text rather than a check constraint: an older reader lists a newer reason as an
-- unreadable row instead of failing the insert of a newer writer.
alter table core.dead_letters add column if not exists reason text;

-- `core.processed_jobs` in 64 slices (ADR 0014), so that the TTL cleanup empties a slice with
-- one TRUNCATE instead of deleting its claims row by row: its cost no longer grows with the
-- table, and the space comes back at once, without waiting for a vacuum.
--
-- A claim's slice is the day of its job id's UUIDv7 time, modulo 64. The slice is a column
-- (PostgreSQL refuses a partition key or a primary key on an expression), every writer names
-- it (the claim path writes into the slice's own table, naming its number; others call
-- `core.processed_slot(job_id)`), and a check constraint holds every row to it, so the
-- primary key `(job_id, consumer, slot)` is exactly as unique as `(job_id, consumer)` was.
-- Every id has a slice, however old, new or odd (a job delayed a hundred years, a retry or a
-- replay under an old id, a cron id from its slot's time, an id that is not a UUIDv7): there is
-- no range to prepare and no gap to fall into. A slice's claims expire together about 30 days
-- after its day; the same slice takes new ids again 64 days after it.
--
-- Writers of the previous schema fail here (their statements name no slot, or a conflict
-- target that no longer exists), they never claim twice.

create function core.processed_slot(job_id uuid) returns smallint
    language sql immutable strict parallel safe
    return ((('x' || encode(substring(uuid_send(job_id) from 1 for 6), 'hex'))::bit(48)::bigint
             / 86400000) % 64)::smallint;

alter table core.processed_jobs rename to processed_jobs_unsliced;
alter table core.processed_jobs_unsliced
    rename constraint processed_jobs_pkey to processed_jobs_unsliced_pkey;
alter index core.processed_jobs_processed_at rename to processed_jobs_unsliced_processed_at;

create table core.processed_jobs (
    job_id       uuid        not null,
    consumer     text        not null,
    processed_at timestamptz not null,
    slot         smallint    not null,
    constraint processed_jobs_slot check (slot = core.processed_slot(job_id)),
    primary key (job_id, consumer, slot)
) partition by list (slot);

-- The cleanup asks each slice for its newest and its expired claims.
create index processed_jobs_processed_at on core.processed_jobs (processed_at);

do $$
begin
    for slot in 0..63 loop
        execute format(
            'create table core.%I partition of core.processed_jobs for values in (%s)',
            'processed_jobs_' || lpad(slot::text, 3, '0'),
            slot
        );
    end loop;
end
$$;

-- Every claim moves, none is lost or doubled (the old key was unique, the slot a function of
-- it); the migration's transaction holds the old table meanwhile.
insert into core.processed_jobs (job_id, consumer, processed_at, slot)
select job_id, consumer, processed_at, core.processed_slot(job_id)
from core.processed_jobs_unsliced;

drop table core.processed_jobs_unsliced;

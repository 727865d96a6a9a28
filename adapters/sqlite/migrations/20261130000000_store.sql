-- The standard's store tables, in one SQLite file (SQLite has no schemas, so `core.` is
-- dropped from the names): `processed_jobs` and `dead_letters`. UUIDs are lower-case hyphenated
-- TEXT, times are INTEGER Unix milliseconds, payloads are BLOBs. STRICT tables reject values
-- of any other type.

create table if not exists processed_jobs (
    job_id       text    not null,
    consumer     text    not null,
    processed_at integer not null,
    primary key (job_id, consumer)
) strict;

-- The TTL purge selects by age.
create index if not exists processed_jobs_processed_at on processed_jobs (processed_at);

create table if not exists dead_letters (
    -- autoincrement: ids are never reused, so the listing cursor only moves forward.
    id             integer primary key autoincrement,
    job_id         text    null,
    queue          text    not null,
    tenant_id      text    null,
    kind           text    null,
    correlation_id text    null,
    payload        blob    not null,
    attempts       integer not null check (attempts >= 0),
    last_error     text    not null,
    dedup_key      text    null,
    status         text    not null default 'pending_review'
                   check (status in ('pending_review', 'replayed', 'discarded')),
    created_at     integer not null,
    updated_at     integer not null
) strict;

-- Listing: by status, by queue, by tenant, each in id order for keyset pagination.
create index if not exists dead_letters_status_id on dead_letters (status, id);
create index if not exists dead_letters_queue_status_id on dead_letters (queue, status, id);
create index if not exists dead_letters_tenant_status_id on dead_letters (tenant_id, status, id);

-- At most one pending letter per queue and dedup key: a message dead-lettered but not acked
-- comes back and must not become a second pending letter.
create unique index if not exists dead_letters_pending_dedup
    on dead_letters (queue, dedup_key)
    where status = 'pending_review' and dedup_key is not null;

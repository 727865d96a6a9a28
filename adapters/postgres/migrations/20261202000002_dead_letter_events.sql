-- The audit trail of the dead letters: one row per status change (replayed or discarded), by
-- whom and when, written by the same statement as the change itself, so the history never
-- misses nor invents one. Read per letter in insertion order, hence the index.
--
-- `core.dead_letters` is a plain table (not partitioned) and is never purged by the library,
-- so the foreign key holds; deleting a letter by hand takes its history with it. A `truncate`
-- of `core.dead_letters` must name this table too (or say `cascade`).
create table if not exists core.dead_letter_events (
    id          bigint generated always as identity primary key,
    letter_id   bigint      not null references core.dead_letters (id) on delete cascade,
    at          timestamptz not null,
    from_status text        not null
                check (from_status in ('pending_review', 'replayed', 'discarded')),
    to_status   text        not null
                check (to_status in ('pending_review', 'replayed', 'discarded')),
    "by"        text        not null
);

create index if not exists dead_letter_events_letter_id
    on core.dead_letter_events (letter_id, id);

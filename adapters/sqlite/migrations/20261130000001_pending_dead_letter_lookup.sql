-- A claim in `processed_jobs` is refused while the job waits in the dead letters, so a
-- redelivered or republished copy is not run behind the operator's back. The claim looks the
-- pending letter up by its dedup key (the job id) alone.
create index if not exists dead_letters_pending_key
    on dead_letters (dedup_key)
    where status = 'pending_review';

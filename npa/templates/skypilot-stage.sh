# npa's stage library: what every node of a SkyPilot wave task does around the stage's command,
# so the command sees the stage contract (docs/spec.md): its source as files in /npa/source, its
# inputs in /npa/inputs, an empty /npa/outputs, and NPA_WAVE, NPA_SHARD and NPA_ATTEMPT.
# The store is reached with the AWS CLI and the credentials and endpoint in the pod's environment.
# A node ends with 75 (EX_TEMPFAIL, a temporary failure) when the store stopped answering
# (npa_aws gave up); npa takes that exit for transient infrastructure and launches the stage
# again (npa.launch.supervision). Any other failure of the library ends the node with 1.
# npa_die: the status of the command that failed decides; npa_end: $1 is that status.
NPA_TEMPFAIL=75
npa_die() { npa_end "$?" "$@"; }
npa_end() {
  _npa_s=$1; shift; echo "npa: $*" >&2
  if [ "$_npa_s" = "$NPA_TEMPFAIL" ]; then exit "$NPA_TEMPFAIL"; fi
  exit 1
}
npa_as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo -n "$@"; fi; }
# The store through the AWS CLI, riding out an outage as npa's own executor does: a call that
# fails is asked again, pausing 1 s and doubling to 15 s, until it has failed for
# NPA_STORE_OUTAGE_SECONDS (120 by default). An answer a person must act on (refused or missing
# credentials, a missing bucket or key, a malformed request, a missing local file) is final,
# with the AWS CLI's status; an outage that outlasts the patience returns $NPA_TEMPFAIL.
npa_aws() {
  _npa_pause=1 _npa_waited=0 _npa_err=$(mktemp) _npa_limit=${NPA_STORE_OUTAGE_SECONDS:-120}
  _npa_limit=${_npa_limit%%.*}
  while :; do
    aws "$@" --only-show-errors 2>"$_npa_err" && { rm -f "$_npa_err"; return 0; }
    _npa_rc=$?
    if grep -Eq 'AccessDenied|InvalidAccessKeyId|SignatureDoesNotMatch|ExpiredToken|NoSuchBucket|NoSuchKey|\((400|403|404)\)|Unable to locate credentials|does not exist' "$_npa_err"; then
      cat "$_npa_err" >&2; rm -f "$_npa_err"; return "$_npa_rc"
    fi
    if [ "$_npa_waited" -ge "${_npa_limit:-0}" ]; then
      cat "$_npa_err" >&2; rm -f "$_npa_err"
      echo "npa: the store did not complete 'aws $1 $2' for ${_npa_waited}s (NPA_STORE_OUTAGE_SECONDS=$_npa_limit): a temporary failure (exit $NPA_TEMPFAIL)" >&2
      return "$NPA_TEMPFAIL"
    fi
    echo "npa: the store did not complete 'aws $1 $2' ($(tail -n 1 "$_npa_err")); asking again in ${_npa_pause}s" >&2
    sleep "$_npa_pause"
    _npa_waited=$((_npa_waited + _npa_pause))
    _npa_pause=$((_npa_pause * 2)); [ "$_npa_pause" -le 15 ] || _npa_pause=15
  done
}

# The times of this node's phases, one "name=value" a line (npa.backends.phases): the setup
# notes when it began (the pod had started) and when its inputs were in place; the run notes its
# command's start, end and exit code and its upload, and writes the record as it exits.
NPA_PHASES=${NPA_PHASES:-/tmp/npa/phases}
npa_mark() { echo "$1=${2:-$(date -u +%Y-%m-%dT%H:%M:%SZ)}" >> "$NPA_PHASES"; }

# The phase record as JSON, from $NPA_PHASES (a later line wins). $1: stage, $2: wave, $3: shard,
# $4: attempt. A phase not reached is null.
npa_phases_json() {
  awk -F= -v stage="$1" -v wave="$2" -v shard="$3" -v attempt="$4" '
    { v[$1] = substr($0, length($1) + 2) }
    function t(k) { return (k in v) ? "\"" v[k] "\"" : "null" }
    END {
      printf "{\"stage\":\"%s\",\"wave\":%d,\"shard\":%d,\"attempt\":%d,", stage, wave, shard, attempt
      printf "\"backend\":\"skypilot\",\"started_at\":%s,\"inputs_at\":%s,", t("started_at"), t("inputs_at")
      printf "\"command_started_at\":%s,\"command_ended_at\":%s,", t("command_started_at"), t("command_ended_at")
      printf "\"exit_code\":%s,\"uploaded_at\":%s,", ("exit_code" in v) ? v["exit_code"] + 0 : "null", t("uploaded_at")
      printf "\"ended_at\":%s,\"note\":\"\"}\n", t("ended_at")
    }' "$NPA_PHASES"
}

# run, as it exits (trap): the phase record into the store, one try; a record that cannot be
# written is said on stderr and changes nothing: the shard's exit status stays its own. $1: it.
npa_record() {
  npa_mark ended_at
  npa_phases_json "$_npa_stage" "$NPA_WAVE" "$NPA_SHARD" "$NPA_ATTEMPT" \
    | aws s3 cp - "$_npa_record" --only-show-errors \
    || echo "npa: the phase record was not stored at $_npa_record" >&2
  exit "$1"
}

# setup: /npa owned by the stage's user, empty, and the AWS CLI there.
npa_begin() {
  : > "$NPA_PHASES"; npa_mark started_at
  command -v aws >/dev/null 2>&1 \
    || npa_die "the image has no aws CLI on PATH; a stage fetches its source and inputs with it"
  { npa_as_root mkdir -p /npa && npa_as_root chown "$(id -u):$(id -g)" /npa; } \
    || npa_die "cannot make /npa as $(id -u) (the image needs passwordless sudo)"
  chmod -R u+w /npa 2>/dev/null || true
  rm -rf /npa/source /npa/inputs /npa/outputs /tmp/npa-source
  mkdir -p /npa/source /npa/inputs /npa/outputs /tmp/npa-source/blobs
}

# setup: the run's committed source as files. $1: the workflow's shared source (blobs and trees),
# $2: the run's manifest. The tree's list (digest, mode, path with \0ooo escapes) names each file.
npa_restore() {
  c=/tmp/npa-source
  npa_aws s3 cp "$2" "$c/manifest.json" || npa_die "cannot read the run's source manifest $2"
  tree=$(sha256sum "$c/manifest.json" | cut -c1-64)
  npa_aws s3 cp "$1/trees/$tree.list" "$c/files" || npa_die "cannot read $1/trees/$tree.list"
  npa_aws s3 sync "$1/blobs/" "$c/blobs/" || npa_die "cannot fetch the source blobs from $1"
  (cd "$c/blobs" && awk '{ print $1 "  " $1 }' "$c/files" | sha256sum -c - >/dev/null) \
    || npa_die "a source blob does not match its digest"
  while read -r sum mode path; do
    p=$(printf '%bx' "$path") && p=${p%x}
    case $p in */*) mkdir -p "/npa/source/${p%/*}" ;; esac
    { cp "$c/blobs/$sum" "/npa/source/$p" && chmod "$mode" "/npa/source/$p"; } \
      || npa_die "cannot restore source file $p"
  done < "$c/files"
}

# setup: one input. $1: URI, $2: path, $3: file | prefix | auto (an external URI: a folder when
# it ends in /, else the object with exactly that key, else the folder under it).
npa_fetch() {
  case "$3" in
    file) npa_aws s3 cp "$1" "$2" ;;
    prefix) mkdir -p "$2" && npa_aws s3 sync "${1%/}/" "$2" ;;
    *) case "$1" in
         */) mkdir -p "$2" && npa_aws s3 sync "$1" "$2" ;;
         *) npa_aws s3 cp "$1" "$2" 2>/dev/null || { mkdir -p "$2" && npa_aws s3 sync "$1/" "$2"; } ;;
       esac ;;
  esac || npa_die "cannot fetch input $2 from $1"
  [ -f "$2" ] || [ -n "$(find "$2" -type f | head -n 1)" ] || npa_die "input $2: nothing at $1"
}

# setup: the source and inputs are for reading.
npa_seal() { chmod -R a-w /npa/source /npa/inputs && npa_mark inputs_at; }

# run: this start of a shard counted at $1, as NPA_ATTEMPT. No count yet is 0; a store that
# stopped answering is not "no count" (a second attempt 1 would hide the first).
npa_count_start() {
  before=$(npa_aws s3 cp "$1" - 2>/dev/null) || {
    _npa_s=$?; [ "$_npa_s" != "$NPA_TEMPFAIL" ] || npa_end "$_npa_s" "cannot read the start count at $1"
    before=0
  }
  NPA_ATTEMPT=$((${before:-0} + 1))
  echo "$NPA_ATTEMPT" | npa_aws s3 cp - "$1" || npa_die "cannot count this start at $1"
}

# run: this node's shard of the wave, and its start counted in the store; from then on, its
# phase record is written as the run exits. $1: the stage's attempts prefix, $2: the stage,
# $3: what follows the count's key for a phase record (printf, the attempt for its %s).
npa_shard() {
  NPA_SHARD=$((NPA_WAVE * NPA_SHARDS_PER_WAVE + ${SKYPILOT_NODE_RANK:-0}))
  key="$1/wave-$NPA_WAVE-shard-$NPA_SHARD"
  npa_count_start "$key"
  export NPA_SHARD NPA_ATTEMPT
  _npa_stage=$2 _npa_record="$key$(printf "$3" "$NPA_ATTEMPT")"
  [ -f "$NPA_PHASES" ] || npa_mark started_at  # a node whose setup left no notes
  trap 'npa_record $?' EXIT
  rm -rf /npa/outputs /npa/home && mkdir -p /npa/outputs /npa/home
}

# run: an output's folder (prefix) or its parent folder (file). $1: kind, $2: path.
npa_output() { if [ "$1" = file ]; then mkdir -p "${2%/*}"; else mkdir -p "$2"; fi; }

# run: the stage's command, in the contract's working directory, with its own HOME, without
# the variables named after $3 (the store's credentials: the library's, never the command's),
# and with each secret $3 names under its own name (the pod has it as NPA_SECRET_<NAME>, from
# the run's Secret; the command sees NAME and not that carrier). $1: the stage's HOME (never in
# the task's envs: SkyPilot's own setup would use it), $2: the command, $3: the secrets' names,
# space separated (spec names: letters, digits, '_').
npa_command() {
  _npa_home=$1 _npa_cmd=$2 _npa_secrets=$3; shift 3
  npa_mark command_started_at
  (
    cd /npa/source && unset "$@" && HOME=$_npa_home && export HOME || exit
    # The names, then the command, as words: no variable of the loop that a secret's name (any
    # variable name) could overwrite. The values are expanded, never parsed.
    # shellcheck disable=SC2086
    set -- $_npa_secrets -- "$_npa_cmd"
    while [ "$1" != -- ]; do
      eval "export $1=\"\${NPA_SECRET_$1?the pod was not given secret $1}\"" || exit
      unset "NPA_SECRET_$1"
      shift
    done
    exec /bin/sh -c "$2"
  )
  _npa_rc=$?
  npa_mark command_ended_at; npa_mark exit_code "$_npa_rc"
  return "$_npa_rc"
}

# run: what the shard left in one output. $1: kind, $2: path, $3: URI.
npa_upload() {
  if [ "$1" = file ]; then
    [ ! -f "$2" ] || npa_aws s3 cp "$2" "$3"
  else
    [ ! -d "$2" ] || npa_aws s3 sync "$2/" "${3%/}/"
  fi || npa_die "cannot upload output $2 to $3"
}

# run: every output is in the store.
npa_uploaded() { npa_mark uploaded_at; }

//! Lab tests on one rxe device, client and server as two processes on loopback
//! (`lab/run`): every test, fabric control, hardening, soak, memory, ring and Job that
//! needs no second NIC.

use super::common::*;

#[test]
fn lab_00_runs_on_rxe() {
    let out = run(&["devices", "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let devs: Value = serde_json::from_str(&out.stdout).unwrap();
    let rxe = devs.as_array().unwrap().iter().find(|d| d["name"].as_str().unwrap().starts_with("rxe"));
    let rxe = rxe.expect("an rxe device: the lab tests must run on soft-RoCE");
    assert!(std::path::Path::new("/sys/class/infiniband").join(rxe["name"].as_str().unwrap()).exists());
    let port = &rxe["ports"][0];
    assert_eq!(port["state"], "ACTIVE");
    assert_eq!(port["link_layer"], "Ethernet");
    let g1 = port["gids"].as_array().unwrap().iter().find(|g| g["index"] == 1).expect("GID index 1");
    assert_eq!(g1["kind"], "RoCEv2");
    assert_eq!(g1["gid"], format!("::ffff:{}", server_addr()));
    let table = run(&["devices"]);
    assert!(table.stdout.contains(&server_addr()) && table.stdout.contains("RoCEv2"), "{}", table.stdout);
}

#[test]
fn lab_write_lat_several_sizes_counts_every_sample() {
    for size in ["2", "64", "4096", "65536"] {
        let dir = tempfile::tempdir().unwrap();
        let f = json_file(&dir, "lat.json");
        let (c, s) = ok_pair("write-lat", &["-s", size, "-n", "300", "--json", &f]);
        assert!(c.stdout.contains("one-way latency") && s.stdout.contains("t_p99.99"), "{}", c.stdout);
        let doc = valid_doc(&std::fs::read_to_string(&f).unwrap());
        let r = &doc["results"][0];
        let size: u64 = size.parse().unwrap();
        assert_eq!(r["size"], size);
        assert_eq!(r["iterations"], 300);
        assert_eq!(r["latency"]["samples"], 300, "one sample per iteration");
        assert_eq!(r["bytes"], size * 300);
        let l = &r["latency"];
        let order = ["min_ns", "p50_ns", "p90_ns", "p99_ns", "p999_ns", "p9999_ns", "max_ns"];
        for w in order.windows(2) {
            assert!(l[w[0]].as_f64().unwrap() <= l[w[1]].as_f64().unwrap(), "{} > {}: {l}", w[0], w[1]);
        }
        assert!(l["min_ns"].as_f64().unwrap() > 0.0);
    }
}

/// Sizes given with the byte suffixes; every write completes once; the peak is a measured
/// window's rate when the run is at least two windows long, and the table and JSON say so
/// when the run is no longer than one window (the peak is then the average).
#[test]
fn lab_write_bw_several_sizes_moves_size_times_iterations() {
    for (text, size, iters) in [("8", 8u64, 2000u64), ("4K", 4096, 1000), ("64KiB", 65536, 500), ("1M", 1 << 20, 40)] {
        let (c, _) = ok_pair("write-bw", &["-s", text, "-n", &iters.to_string(), "--json", "-"]);
        let doc = valid_doc(&c.stdout);
        let r = &doc["results"][0];
        assert_eq!(r["size"], size, "-s {text}");
        assert_eq!(r["iterations"], iters);
        assert_eq!(r["bandwidth"]["messages"], iters, "every posted write completed once");
        assert_eq!(r["bandwidth"]["bytes"], size * iters);
        assert_eq!(r["bytes"], size * iters);
        let avg = r["bandwidth"]["avg_bytes_per_sec"].as_f64().unwrap();
        let peak = r["bandwidth"]["peak_bytes_per_sec"].as_f64().unwrap();
        assert!(avg > 0.0 && peak >= avg, "peak {peak} avg {avg}");
        assert!(c.stderr.contains("BW average[MB/sec]"), "table goes to stderr with --json -: {}", c.stderr);
        let window = r["bandwidth"]["peak_window_messages"].as_u64().unwrap();
        let is_average = r["bandwidth"]["peak_is_average"] == true;
        if iters <= window {
            assert!(is_average && peak == avg, "{iters} messages, window {window}: {r}");
            assert!(c.stderr.contains("(peak = average: the run is no longer than the"), "{}", c.stderr);
        } else if iters >= 2 * window {
            assert!(!is_average && !c.stderr.contains("peak = average"), "{iters} messages, window {window}: {r}");
        }
    }
}

#[test]
fn lab_sweep_json_keeps_every_size() {
    let dir = tempfile::tempdir().unwrap();
    let f = json_file(&dir, "sweep.json");
    ok_pair("write-lat", &["-a", "-n", "5", "--json", &f]);
    let doc = valid_doc(&std::fs::read_to_string(&f).unwrap());
    let sizes: Vec<u64> = doc["results"].as_array().unwrap().iter().map(|r| r["size"].as_u64().unwrap()).collect();
    assert_eq!(sizes, (1..=23).map(|p| 1u64 << p).collect::<Vec<_>>());
    for r in doc["results"].as_array().unwrap() {
        assert_eq!(r["latency"]["samples"], 5);
    }
    let (c, _) = ok_pair("write-bw", &["-a", "-n", "4", "--report_gbits", "--json", "-"]);
    let doc = valid_doc(&c.stdout);
    assert_eq!(doc["results"].as_array().unwrap().len(), 23);
    assert!(c.stderr.contains("Gb/sec"));
}

#[test]
fn lab_duration_mode_keeps_percentiles() {
    let (c, _) = ok_pair("write-lat", &["-D", "1", "--json", "-"]);
    let doc = valid_doc(&c.stdout);
    let r = &doc["results"][0];
    let samples = r["latency"]["samples"].as_u64().unwrap();
    assert!(samples > 10, "{samples}");
    assert_eq!(r["iterations"].as_u64().unwrap(), samples);
    assert!(r["latency"]["p99_ns"].as_f64().unwrap() > 0.0);
    let (c, _) = ok_pair("write-bw", &["-D", "1", "-s", "4096", "--json", "-"]);
    let doc = valid_doc(&c.stdout);
    assert!(doc["results"][0]["bandwidth"]["messages"].as_u64().unwrap() > 10);
}

#[test]
fn lab_validate_data_passes_on_clean_runs() {
    ok_pair("write-lat", &["--validate-data", "-s", "4096", "-n", "200"]);
    ok_pair("write-lat", &["--validate-data", "-s", "1", "-n", "50"]);
    ok_pair("write-bw", &["--validate-data", "-s", "65536", "-n", "500"]);
    ok_pair("write-bw", &["--validate-data", "-s", "100", "-n", "3000", "-t", "64"]);
}

#[test]
fn lab_validate_data_catches_a_corrupted_byte() {
    let (c, s) = pair("write-lat", &["--validate-data", "-s", "512", "-n", "100", "--inject-corruption", "50"], &[]);
    assert_eq!(c.code, 1, "client: {}", c.stderr);
    assert_eq!(s.code, 1, "server: {}", s.stderr);
    assert!(c.stderr.contains("data mismatch at iteration 50"), "{}", c.stderr);
    let (c, s) = pair("write-bw", &["--validate-data", "-s", "4096", "-n", "300", "--inject-corruption", "299"], &[]);
    assert_eq!((c.code, s.code), (1, 1), "client: {}\nserver: {}", c.stderr, s.stderr);
    assert!(c.stderr.contains("data mismatch in message 299"), "{}", c.stderr);
}

#[test]
fn lab_killed_peer_ends_the_other_side_with_exit_4_in_time() {
    // The ring tests too: a producer waiting for credit, a consumer waiting for records.
    for test in ["write-lat", "write-bw", "ring-bw", "ring-lat"] {
        for server_dies in [true, false] {
            let (_, other, waited) = disrupt(test, server_dies, libc::SIGKILL);
            assert_eq!(other.code, 4, "{test}, server dies: {server_dies}: {}", other.stderr);
            assert!(waited < Duration::from_secs(3) + GRACE, "{test}: took {waited:?} (timeout 3 s)");
            assert!(other.stderr.contains("peer") || other.stderr.contains("server"), "{}", other.stderr);
        }
    }
}

/// A stopped peer (SIGSTOP) is caught by its silence on the control channel within
/// `--timeout` (3 s) + 1 s, on either side: in a ping-pong, in a bandwidth run whose
/// completions keep flowing (a stopped process's NIC still answers RDMA) and in a read
/// round trip (the server is passive); the message says the peer's host still answers, so
/// its process is stopped or hung.
#[test]
fn lab_stopped_peer_is_told_by_its_silence_within_the_timeout() {
    for test in ["write-lat", "write-bw", "read-lat"] {
        for server_stops in [true, false] {
            let (_, other, waited) = disrupt(test, server_stops, libc::SIGSTOP);
            let case = format!("{test}, the {} stopped", if server_stops { "server" } else { "client" });
            assert_eq!(other.code, 4, "{case}: {}", other.stderr);
            assert!(waited < Duration::from_secs(4), "{case}: took {waited:?} (--timeout 3)");
            assert!(waited >= Duration::from_millis(2400), "{case}: ended before its timeout: {waited:?}");
            assert!(other.stderr.contains("so its process is stopped or hung"), "{case}: {}", other.stderr);
            eprintln!("{case}: the other side ended after {waited:?}");
        }
    }
}

/// A server alive but stuck mid-run (its session thread stands still after `Ready` while
/// its keepalive beats: `RDMABENCH_FAULT=stall:server-run`) is named by its client, with
/// what it was doing: in a ping-pong as soon as a reply is overdue (`--timeout`, 2 s), in
/// a bandwidth run (whose writes complete without the server's CPU) while the client
/// waits for its verdict, within the stuck bound (12 x --timeout = 24 s).
#[test]
fn lab_a_peer_alive_but_stuck_mid_run_is_named_within_the_bound() {
    for (test, bound) in [("write-lat", Duration::from_secs(2)), ("write-bw", Duration::from_secs(24))] {
        let port = next_port();
        let server = Command::new(BIN)
            .args([test, "-p", &port, "--connect-timeout", "30", "--timeout", "2"])
            .env("RDMABENCH_FAULT", "stall:server-run")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let addr = server_addr();
        let t = Instant::now();
        let client =
            finish(spawn(&[test, "-p", &port, "--timeout", "2", "-n", "2000", &addr]), Duration::from_secs(60));
        let took = t.elapsed();
        // The stuck server goes on until told to stop, as a process stuck in a call would.
        unsafe { libc::kill(server.id() as i32, libc::SIGTERM) };
        let server = finish(server, Duration::from_secs(20));
        assert_eq!(
            client.code, 4,
            "{test}: {}
{}",
            client.stdout, client.stderr
        );
        let m = &client.stderr;
        assert!(m.contains("alive but stuck") && m.contains("serving the run of size"), "{test}: {m}");
        assert!(took < bound + GRACE + Duration::from_secs(3), "{test}: named after {took:?} (bound {bound:?})");
        assert!(server.stderr.contains("stands still at server-run"), "{test}: {}", server.stderr);
        eprintln!("{test}: the stuck server was named after {took:?}");
    }
}

/// `--timeout` bounds a peer's silence, never a run's length: 50 QPs of 4 MiB messages
/// complete only every few seconds here (the whole window shares the link) and pass with
/// a 5 s timeout; a 26 s run passes with a 2 s timeout: longer than the 24 s a peer may
/// stand still (12 x --timeout), which a running side never does.
#[test]
fn lab_long_runs_and_sparse_completions_are_not_a_lost_peer() {
    let t = Instant::now();
    // Both sides run with --timeout 5 (`pair`); the issue's run failed with 10.
    let (c, s) = ok_pair("write-bw", &["-q", "50", "-s", "4194304", "-n", "10"]);
    eprintln!("write-bw -q 50 -s 4M -n 10 --timeout 5 passed in {:?}", t.elapsed());
    assert!(c.stdout.contains("4194304"), "{}", c.stdout);
    assert_eq!(s.code, 0, "{}", s.stderr);
    let t = Instant::now();
    let (c, s) = pair_with_timeout("write-bw", "2", &["-D", "26", "-q", "2"], &[]);
    assert_eq!((c.code, s.code), (0, 0), "{}\n{}", c.stderr, s.stderr);
    assert!(t.elapsed() >= Duration::from_secs(26), "{:?}", t.elapsed());
    assert!(c.stdout.contains("65536"), "{}", c.stdout);
}

#[test]
fn lab_sigint_releases_and_tells_the_peer() {
    let (client, server, _) = disrupt("write-lat", false, libc::SIGINT);
    assert_eq!(client.code, 130, "{}", client.stderr);
    assert!(client.stderr.contains("interrupted"), "{}", client.stderr);
    assert_eq!(server.code, 4, "{}", server.stderr);
    assert!(server.stderr.contains("interrupted"), "the server names the reason: {}", server.stderr);
    let (server, _client, _) = disrupt("write-bw", true, libc::SIGTERM);
    assert_eq!(server.code, 143, "{}", server.stderr);
}

#[test]
fn lab_client_started_before_its_server_connects() {
    let port = next_port();
    let addr = server_addr();
    let client = spawn(&["write-lat", "-p", &port, "-n", "100", "--connect-timeout", "30", &addr]);
    std::thread::sleep(Duration::from_secs(2));
    let server = spawn(&["write-lat", "-p", &port]);
    let c = finish(client, Duration::from_secs(60));
    let s = finish(server, Duration::from_secs(30));
    assert_eq!((c.code, s.code), (0, 0), "client: {}\nserver: {}", c.stderr, s.stderr);
}

#[test]
fn lab_server_with_no_client_gives_up_after_connect_timeout() {
    let t = Instant::now();
    let s = finish(spawn(&["write-bw", "-p", &next_port(), "--connect-timeout", "2"]), Duration::from_secs(20));
    assert_eq!(s.code, 4, "{}", s.stderr);
    assert!(t.elapsed() < Duration::from_secs(2) + GRACE, "took {:?} (--connect-timeout 2)", t.elapsed());
    let c = finish(
        spawn(&["write-bw", "-p", &next_port(), "--connect-timeout", "2", &server_addr()]),
        Duration::from_secs(20),
    );
    assert_eq!(c.code, 4, "{}", c.stderr);
    assert!(c.stderr.contains("--connect-timeout"), "{}", c.stderr);
}

#[test]
fn lab_gid_mismatch_names_both_sides_and_valid_indexes() {
    let (c, s) = pair("write-lat", &["-n", "10"], &["-x", "0"]);
    assert_eq!((c.code, s.code), (2, 2), "client: {}\nserver: {}", c.stderr, s.stderr);
    for part in ["GID mismatch", "index 1", "index 0", "ipv4", "ipv6", "-x 1"] {
        assert!(c.stderr.contains(part), "missing {part:?}: {}", c.stderr);
    }
    ok_pair("write-lat", &["-n", "10", "-x", "1"]);
}

/// Bad input fails before any server is contacted, with the limit and the fix.
#[test]
fn lab_bad_input_names_the_limit_and_exits_with_its_code() {
    let addr = server_addr();
    let cases: &[(&[&str], i32, &[&str])] = &[
        (&["write-bw", "-s", "0"], 2, &["size 0", "-s"]),
        (&["write-bw", "-s", "16777216"], 2, &["max message size", "-s 1..="]),
        (&["write-lat", "-I", "100000"], 2, &["max inline data", "-I 0..="]),
        (&["write-bw", "-t", "2000000"], 2, &["max_qp_wr", "-t 1..="]),
        (&["write-bw", "-d", "nosuch0"], 3, &["no RDMA device named nosuch0", "rxe0"]),
        (&["write-bw", "-i", "2"], 2, &["no port 2", "-i 1..=1"]),
        (&["write-bw", "-x", "7"], 2, &["GID index 7", "empty", "-x 1"]),
        (&["write-bw", "-x", "5000"], 2, &["out of range", "-x 1"]),
        (&["write-bw", "-m", "1500"], 2, &["MTU 1500", "4096"]),
    ];
    for (args, code, parts) in cases {
        let mut a = args.to_vec();
        a.extend(["-p", "19999", "--connect-timeout", "1", &addr]);
        let t = Instant::now();
        let out = run(&a);
        assert_eq!(out.code, *code, "{args:?}: {}", out.stderr);
        assert!(t.elapsed() < Duration::from_secs(10), "{args:?} should fail before connecting");
        for p in *parts {
            assert!(out.stderr.contains(p), "{args:?}: missing {p:?} in {}", out.stderr);
        }
    }
}

#[test]
fn lab_memlock_too_low_says_how_much_and_how_to_raise_it() {
    let cmd = format!(
        "ulimit -l 64 && exec setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all --bounding-set=-all \
         {BIN} write-bw -s 1048576 -p 19998 --connect-timeout 1 {}",
        server_addr()
    );
    let out = Command::new("bash").arg("-c").arg(cmd).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    for part in ["ulimit -l", "64.0 KiB", "IPC_LOCK", "2048 KiB"] {
        assert!(stderr.contains(part), "missing {part:?}: {stderr}");
    }
}

#[test]
fn lab_handshake_hang_or_garbage_ends_with_exit_4_and_a_message() {
    use std::io::Write;
    let addr = server_addr();
    // A server that accepts and never answers: the client gives up after --timeout.
    let (port, h) = fake_server(|s| {
        std::thread::sleep(Duration::from_secs(8));
        drop(s);
    });
    let t = Instant::now();
    let c = finish(spawn(&["write-lat", "-p", &port, "--timeout", "2", &addr]), Duration::from_secs(20));
    assert_eq!(c.code, 4, "{}", c.stderr);
    assert!(t.elapsed() < Duration::from_secs(2) + GRACE, "took {:?} (--timeout 2)", t.elapsed());
    assert!(c.stderr.contains("greeting") && c.stderr.contains("--timeout"), "{}", c.stderr);
    h.join().unwrap();

    // A server that answers with an oversized frame header.
    let (port, h) = fake_server(|mut s| {
        s.write_all(&u32::MAX.to_be_bytes()).unwrap();
        std::thread::sleep(Duration::from_secs(2));
    });
    let c = finish(spawn(&["write-lat", "-p", &port, "--timeout", "5", &addr]), Duration::from_secs(20));
    assert_eq!(c.code, 4, "{}", c.stderr);
    assert!(c.stderr.contains("bad frame") && c.stderr.contains("exceeds"), "{}", c.stderr);
    h.join().unwrap();
}

/// `run --serve` survives every hostile connection and a spec over its memory budget
/// (refused at once, allocating nothing: its peak RSS stays small), then serves a real
/// workload and ends when it finishes.
#[test]
fn lab_serve_outlives_hostile_connections_and_refuses_specs_over_its_memory_budget() {
    let port = next_port();
    let args = ["run", "--serve", "-p", &port, "--timeout", "2", "--connect-timeout", "60", "--max-memory", "32M"];
    let server = spawn(&args);
    let strays = hostile_connections(&port, Duration::from_secs(2));
    // 8 QPs x (8 MiB send + 8 MiB receive) = 128 MiB, over the server's 32 MiB; asked while
    // the silent and heartbeat-only connections are open, with a wait shorter than theirs:
    // they hold up no one.
    let addr = server_addr();
    let t = Instant::now();
    let big = run(&["write-bw", "-s", "8M", "-q", "8", "-n", "10", "-p", &port, "--timeout", "1", &addr]);
    let refused_in = t.elapsed();
    eprintln!("refused in {refused_in:?} (client start to exit); server peak RSS {} kB", peak_rss_kb(server.id()));
    assert_eq!(big.code, 2, "{}", big.stderr);
    for part in ["needs 128.0 MiB", "this server", "--max-memory 32.0 MiB"] {
        assert!(big.stderr.contains(part), "missing {part:?}: {}", big.stderr);
    }
    assert!(peak_rss_kb(server.id()) < 64 << 10, "the server allocated: {} kB", peak_rss_kb(server.id()));
    // The server's part alone: that hello, replayed by hand, is refused in under a second.
    let hello = captured_hello(&["write-bw", "-s", "8M", "-q", "8", "-n", "10"]);
    let mut raw = connect_raw(&port);
    assert!(read_frame(&mut raw).contains("greeting"));
    let t = Instant::now();
    std::io::Write::write_all(&mut raw, &frame(&hello)).unwrap();
    let answer = read_frame(&mut raw);
    eprintln!("the server refused the replayed hello in {:?}", t.elapsed());
    assert!(t.elapsed() < Duration::from_secs(1), "took {:?}", t.elapsed());
    assert!(answer.contains("refuse") && answer.contains("--max-memory 32.0 MiB"), "{answer}");
    assert!(peak_rss_kb(server.id()) < 64 << 10, "the server allocated: {} kB", peak_rss_kb(server.id()));
    // The client's own budget refuses before any connection.
    let own = run(&["write-bw", "-s", "8M", "-q", "8", "--max-memory", "1M", "-p", &port, &addr]);
    assert_eq!(own.code, 2, "{}", own.stderr);
    assert!(own.stderr.contains("this client") && own.stderr.contains("--max-memory 1.0 MiB"), "{}", own.stderr);
    strays.join().unwrap();
    let args = ["run", &workload_path("smoke.toml"), "--peer", &addr, "-p", &port, "--connect-timeout", "30"];
    let c = finish(spawn(&args), Duration::from_secs(300));
    assert_eq!(c.code, 0, "{}\n{}", c.stdout, c.stderr);
    let s = finish(server, Duration::from_secs(60));
    assert_eq!(s.code, 0, "still serving, and ends when the client finishes: {}", s.stderr);
    assert_eq!(s.stderr.matches("ended before its test").count(), 5, "each stray is logged: {}", s.stderr);
    for part in ["127.0.0.1:", "bad frame", "sent nothing, not even a heartbeat, for 2.0 s", "needs 128.0 MiB"] {
        assert!(s.stderr.contains(part), "missing {part:?}: {}", s.stderr);
    }
}

/// A one-test server too: hostile connections are logged and the real client, coming
/// while two of them are still open and waiting less than they do, is served.
#[test]
fn lab_test_server_outlives_hostile_connections_then_serves_its_client() {
    let port = next_port();
    let server = spawn(&["write-lat", "-p", &port, "--timeout", "3", "--connect-timeout", "60"]);
    let strays = hostile_connections(&port, Duration::from_secs(3));
    let c = run(&["write-lat", "-n", "200", "-p", &port, "--timeout", "2", &server_addr()]);
    assert_eq!(c.code, 0, "{}", c.stderr);
    let s = finish(server, Duration::from_secs(30));
    strays.join().unwrap();
    assert_eq!(s.code, 0, "{}", s.stderr);
    // The three quick ones were logged; the open two outlived this server's one test.
    assert_eq!(s.stderr.matches("ended before its test").count(), 3, "{}", s.stderr);
    assert!(!s.stderr.contains("panicked"), "{}", s.stderr);
}

/// With a token, a client without it (or with another) is refused and logged, a finish
/// without it leaves the server running, and the clients that have it pass; the token
/// comes from a file or from $RDMABENCH_TOKEN.
#[test]
fn lab_a_token_keeps_strangers_out_and_lets_its_holders_in() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let token = json_file(&dir, "token");
    std::fs::write(&token, "0123456789abcdef-lab-secret\n").unwrap();
    let wrong = json_file(&dir, "wrong");
    std::fs::write(&wrong, "another-secret-of-enough-bytes\n").unwrap();
    let port = next_port();
    let mut server = spawn(&["run", "--serve", "-p", &port, "--token-file", &token, "--connect-timeout", "60"]);
    let addr = server_addr();
    let none = run(&["write-lat", "-n", "100", "-p", &port, &addr]);
    assert_eq!(none.code, 2, "{}", none.stderr);
    assert!(
        none.stderr.contains("requires the shared token") && none.stderr.contains("no token proof"),
        "{}",
        none.stderr
    );
    let bad = run(&["write-lat", "-n", "100", "-p", &port, "--token-file", &wrong, &addr]);
    assert_eq!(bad.code, 2, "{}", bad.stderr);
    assert!(bad.stderr.contains("proof is wrong"), "{}", bad.stderr);
    // A finish without a proof, by hand: the server answers with a refusal and stays.
    let mut raw = connect_raw(&port);
    raw.write_all(&frame(r#"{"type":"finish"}"#)).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut got = vec![0u8; 4096];
    let mut seen = String::new();
    while !seen.contains("refuse") {
        let n = raw.read(&mut got).unwrap();
        assert!(n > 0, "closed without a refusal: {seen}");
        seen += &String::from_utf8_lossy(&got[..n]);
    }
    std::thread::sleep(Duration::from_millis(500));
    assert!(server.try_wait().unwrap().is_none(), "a finish without the token ended the server");
    let ok = Command::new(BIN)
        .args(["write-lat", "-n", "100", "-p", &port, &addr])
        .env("RDMABENCH_TOKEN", "0123456789abcdef-lab-secret")
        .output()
        .unwrap();
    assert_eq!(ok.status.code(), Some(0), "{}", String::from_utf8_lossy(&ok.stderr));
    let args = ["run", &workload_path("smoke.toml"), "--peer", &addr, "-p", &port, "--token-file", &token];
    let c = finish(spawn(&args), Duration::from_secs(300));
    assert_eq!(c.code, 0, "{}\n{}", c.stdout, c.stderr);
    let s = finish(server, Duration::from_secs(60));
    assert_eq!(s.code, 0, "the authenticated finish ends it: {}", s.stderr);
    assert!(s.stderr.matches("requires the shared token").count() >= 3, "each refusal is logged: {}", s.stderr);
}

/// The server listens on IPv6 and IPv4 by default: a client reaches it at ::1; with
/// --bind, only there.
#[test]
fn lab_clients_reach_the_server_over_ipv6_and_bind_chooses_the_address() {
    let port = next_port();
    let server = spawn(&["write-lat", "-p", &port, "--connect-timeout", "60"]);
    let c = run(&["write-lat", "-n", "100", "-p", &port, "::1"]);
    assert_eq!(c.code, 0, "{}", c.stderr);
    assert_eq!(finish(server, Duration::from_secs(30)).code, 0);
    let port = next_port();
    let server = spawn(&["write-lat", "-p", &port, "--bind", "::1", "--connect-timeout", "60"]);
    let v4 = run(&["write-lat", "-n", "100", "-p", &port, "--connect-timeout", "2", "127.0.0.1"]);
    assert_eq!(v4.code, 4, "bound to ::1 only: {}", v4.stderr);
    let c = run(&["write-lat", "-n", "100", "-p", &port, "[::1]"]);
    assert_eq!(c.code, 0, "{}", c.stderr);
    assert_eq!(finish(server, Duration::from_secs(30)).code, 0);
}

/// SIGTERM to a server in the middle of a measurement: the client ends within a second,
/// exit 4, quoting the server's reason.
#[test]
fn lab_a_terminated_server_tells_its_client_why_within_a_second() {
    for test in ["write-bw", "read-bw", "send-lat"] {
        let (server, client, waited) = disrupt(test, true, libc::SIGTERM);
        eprintln!("{test}: the client ended {waited:?} after SIGTERM to the server");
        assert_eq!(server.code, 143, "{test}: {}", server.stderr);
        assert_eq!(client.code, 4, "{test}: {}", client.stderr);
        assert!(client.stderr.contains("signal 15"), "{test}: the reason is quoted: {}", client.stderr);
        assert!(waited < Duration::from_secs(1), "{test}: took {waited:?}");
    }
}

/// A workload whose serving peer is killed in its third step ends with exit 4 (the peer
/// was lost, not a failed threshold), still writing a valid document and JUnit report.
#[test]
fn lab_run_whose_peer_dies_exits_4_and_still_writes_its_document() {
    let dir = tempfile::tempdir().unwrap();
    let (json, junit) = (json_file(&dir, "lost.json"), json_file(&dir, "lost.xml"));
    let workload = four_step_workload(&dir);
    let (mut server, port) = serve_workload();
    let addr = server_addr();
    let args = ["run", &workload, "--peer", &addr, "-p", &port, "--timeout", "3", "--json", &json, "--junit", &junit];
    let mut client = spawn(&args);
    let stdout = await_output(&mut client, "=== step 3/4", Duration::from_secs(120));
    std::thread::sleep(Duration::from_secs(2));
    server.kill().unwrap();
    let _ = server.wait();
    let mut c = finish(client, Duration::from_secs(120));
    c.stdout = stdout.join().unwrap();
    assert_eq!(c.code, 4, "{}\n{}", c.stdout, c.stderr);
    assert!(c.stderr.contains("the peer was lost in step \"long latency\""), "{}", c.stderr);
    check_stopped_run_files(&json, &junit, "");
}

/// SIGINT in a workload's third step: exit 130, both files written, the server told.
#[test]
fn lab_interrupted_run_exits_130_and_still_writes_its_document() {
    let dir = tempfile::tempdir().unwrap();
    let (json, junit) = (json_file(&dir, "int.json"), json_file(&dir, "int.xml"));
    let workload = four_step_workload(&dir);
    let (server, port) = serve_workload();
    let addr = server_addr();
    let args = ["run", &workload, "--peer", &addr, "-p", &port, "--timeout", "3", "--json", &json, "--junit", &junit];
    let mut client = spawn(&args);
    let stdout = await_output(&mut client, "=== step 3/4", Duration::from_secs(120));
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(unsafe { libc::kill(client.id() as i32, libc::SIGINT) }, 0);
    let mut c = finish(client, Duration::from_secs(60));
    c.stdout = stdout.join().unwrap();
    assert_eq!(c.code, 130, "{}\n{}", c.stdout, c.stderr);
    check_stopped_run_files(&json, &junit, "interrupted by signal 2");
    // The server heard why, and is still serving: stop it.
    let mut server = server;
    assert!(server.try_wait().unwrap().is_none(), "the server ended");
    unsafe { libc::kill(server.id() as i32, libc::SIGTERM) };
    let s = finish(server, Duration::from_secs(30));
    assert!(s.stderr.contains("interrupted by signal 2"), "{}", s.stderr);
}

/// Output paths are tried before step 1: a bad one ends the run at once, exit 2.
#[test]
fn lab_run_with_an_unwritable_output_fails_before_step_1() {
    let t = Instant::now();
    let c = run(&["run", &workload_path("smoke.toml"), "--peer", &server_addr(), "--junit", "/no/such/dir/r.xml"]);
    assert_eq!(c.code, 2, "{}", c.stderr);
    assert!(c.stderr.contains("--junit /no/such/dir/r.xml") && !c.stdout.contains("=== step"), "{}", c.stderr);
    assert!(t.elapsed() < Duration::from_secs(5));
}

/// 50 sessions that fail after the server allocated (a GID mismatch found at the endpoint
/// exchange, clients killed mid-run) leave no QP and no MR behind on one `run --serve`.
#[test]
fn lab_failed_sessions_leave_no_qp_or_mr_behind() {
    let count = |what: &str| {
        let out = Command::new("rdma").args(["-j", "res", "show", what]).output().unwrap();
        assert!(out.status.success(), "rdma res show {what}: {}", String::from_utf8_lossy(&out.stderr));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v.as_array().map_or(0, |a| a.len())
    };
    let (server, port) = serve_workload();
    std::thread::sleep(Duration::from_millis(500));
    let (qps, mrs) = (count("qp"), count("mr"));
    let addr = server_addr();
    for i in 0..50 {
        if i % 10 == 9 {
            // Killed in the middle of its run.
            let mut c = spawn(&["write-bw", "-D", "30", "-q", "2", "-p", &port, "--timeout", "3", &addr]);
            let _ = await_output(&mut c, "#bytes", Duration::from_secs(60));
            std::thread::sleep(Duration::from_millis(300));
            c.kill().unwrap();
            let _ = c.wait();
        } else {
            let c = run(&["write-lat", "-n", "10", "-x", "0", "-p", &port, "--timeout", "3", &addr]);
            assert_eq!(c.code, 2, "a GID mismatch: {}", c.stderr);
        }
    }
    // The last killed client's session ends at the server's --timeout (10 s).
    let t = Instant::now();
    while (count("qp"), count("mr")) != (qps, mrs) && t.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!((count("qp"), count("mr")), (qps, mrs), "QPs and MRs back to the baseline");
    let mut server = server;
    assert!(server.try_wait().unwrap().is_none(), "still serving");
    let c = run(&["write-lat", "-n", "100", "-p", &port, &addr]);
    assert_eq!(c.code, 0, "{}", c.stderr);
    unsafe { libc::kill(server.id() as i32, libc::SIGTERM) };
    let s = finish(server, Duration::from_secs(30));
    assert_eq!(s.stderr.matches("this session failed").count(), 50, "{}", s.stderr);
}

/// Every operation x transport combination rxe supports, at a small and a large size:
/// counts, bytes and data integrity (payloads checked where they land; atomics checked
/// through the returned values and the final counter).
#[test]
fn lab_every_operation_and_transport_moves_and_checks_its_data() {
    struct Case {
        test: &'static str,
        transport: &'static str,
        extra: &'static [&'static str],
        sizes: &'static [u64],
    }
    let payload_sizes: &[u64] = &[8, 65536];
    let cases = [
        Case { test: "write", transport: "RC", extra: &[], sizes: payload_sizes },
        Case { test: "write", transport: "RC", extra: &["--with-imm"], sizes: payload_sizes },
        Case { test: "write", transport: "UC", extra: &[], sizes: payload_sizes },
        Case { test: "write", transport: "UC", extra: &["--with-imm"], sizes: payload_sizes },
        Case { test: "read", transport: "RC", extra: &[], sizes: payload_sizes },
        Case { test: "send", transport: "RC", extra: &[], sizes: payload_sizes },
        Case { test: "send", transport: "RC", extra: &["--with-imm"], sizes: payload_sizes },
        Case { test: "send", transport: "UC", extra: &[], sizes: payload_sizes },
        Case { test: "send", transport: "UD", extra: &[], sizes: &[8, 4096] },
        Case { test: "send", transport: "UD", extra: &["--with-imm"], sizes: &[8, 4096] },
        Case { test: "atomic", transport: "RC", extra: &["-A", "FETCH_AND_ADD"], sizes: &[8] },
        Case { test: "atomic", transport: "RC", extra: &["-A", "CMP_AND_SWP"], sizes: &[8] },
    ];
    for c in &cases {
        for measure in ["lat", "bw"] {
            for &size in c.sizes {
                let test = format!("{}-{measure}", c.test);
                let iters = if measure == "lat" { "100" } else { "300" };
                let size_s = size.to_string();
                let mut args = vec!["-c", c.transport, "-n", iters, "--json", "-"];
                args.extend_from_slice(c.extra);
                if c.test != "atomic" {
                    args.extend(["-s", &size_s, "--validate-data"]);
                }
                let what = format!("{test} {args:?}");
                let (cl, sv) = pair(&test, &args, &[]);
                assert_eq!(cl.code, 0, "{what}: client {}\nserver {}", cl.stderr, sv.stderr);
                assert_eq!(sv.code, 0, "{what}: server {}", sv.stderr);
                let doc = valid_doc(&cl.stdout);
                assert_eq!(doc["spec"]["transport"], c.transport, "{what}");
                let r = &doc["results"][0];
                assert_eq!(r["size"], size, "{what}");
                assert_eq!(r["iterations"].as_u64(), Some(iters.parse().unwrap()), "{what}");
                assert_eq!(r["bytes"].as_u64(), Some(size * iters.parse::<u64>().unwrap()), "{what}");
                if measure == "lat" {
                    assert_eq!(r["latency"]["samples"].as_u64(), r["iterations"].as_u64(), "{what}");
                    let kind = if matches!(c.test, "read" | "atomic") { "round_trip" } else { "one_way" };
                    assert_eq!(r["latency"]["kind"], kind, "{what}");
                } else {
                    assert_eq!(r["bandwidth"]["messages"].as_u64(), r["iterations"].as_u64(), "{what}");
                }
                let receives = c.test == "send" || c.extra.contains(&"--with-imm");
                match (c.transport, receives) {
                    ("RC", _) | (_, false) => assert!(r.get("delivered").is_none(), "{what}"),
                    _ => {
                        let d = r["delivered"].as_u64().unwrap_or(0);
                        assert!(d > 0 && d <= iters.parse().unwrap(), "{what}: delivered {d}");
                    }
                }
            }
        }
    }
}

#[test]
fn lab_refused_combinations_say_why() {
    let addr = server_addr();
    let cases: &[(&str, &[&str], &[&str])] = &[
        ("read-lat", &["-c", "UC"], &["UC has no responder resources", "-c RC"]),
        ("atomic-bw", &["-c", "UD"], &["UD carries only SEND", "-c RC"]),
        ("write-bw", &["-c", "UD"], &["UD carries only SEND", "-c RC or UC"]),
        ("read-bw", &["--with-imm"], &["--with-imm applies to write and send"]),
        ("atomic-lat", &["-s", "64"], &["8 bytes"]),
        ("atomic-lat", &["--validate-data"], &["final counter"]),
        ("send-bw", &["-c", "UD", "-s", "8192"], &["one MTU", "-s 1..=4096"]),
        ("read-bw", &["--outstanding-reads", "1000"], &["max_qp_rd_atom", "--outstanding-reads 1..="]),
        ("send-bw", &["-r", "0"], &["rx depth 0", "-r 1"]),
        ("send-bw", &["-R", "-c", "UD"], &["-R connects RC", "drop -R"]),
        ("write-bw", &["-R", "-c", "UC"], &["-R connects RC", "drop -R"]),
    ];
    for (test, extra, parts) in cases {
        let mut args = vec![*test, "-p", "19997", "--connect-timeout", "1"];
        args.extend_from_slice(extra);
        args.push(&addr);
        let out = run(&args);
        assert_eq!(out.code, 2, "{args:?}: {}", out.stderr);
        for p in *parts {
            assert!(out.stderr.contains(p), "{args:?}: missing {p:?} in {}", out.stderr);
        }
    }
}

#[test]
fn lab_events_post_lists_cpu_util_and_histogram() {
    // -e: completion channels instead of busy polling, on every wait shape.
    for (test, extra) in [
        ("send-lat", &["--validate-data"][..]),
        ("write-lat", &["--with-imm"]),
        ("read-lat", &[]),
        ("atomic-lat", &[]),
        ("write-bw", &["--validate-data"]),
        ("send-bw", &["--validate-data"]),
        ("read-bw", &[]),
    ] {
        let mut args = vec!["-e", "-n", "200", "--cpu-util", "--json", "-"];
        args.extend_from_slice(extra);
        let (c, _) = ok_pair(test, &args);
        let doc = valid_doc(&c.stdout);
        assert_eq!(doc["spec"]["events"], true);
        let cpu = doc["results"][0]["cpu_util_pct"].as_f64().expect("cpu util reported");
        assert!((0.0..=250.0).contains(&cpu), "{test}: cpu {cpu}");
    }
    // -l: chains of exactly N; counts stay exact, also with a ragged last chain.
    for extra in [&["-l", "16"][..], &["-l", "7", "-t", "20", "-Q", "20"], &["-l", "16", "-t", "16"]] {
        let mut args = vec!["-s", "8", "-n", "2001", "--json", "-"];
        args.extend_from_slice(extra);
        let (c, _) = ok_pair("write-bw", &args);
        let doc = valid_doc(&c.stdout);
        assert_eq!(doc["results"][0]["bandwidth"]["messages"], 2001, "{extra:?}");
    }
    // --histogram: one tagged histogram per size in HdrHistogram's interval-log format.
    let dir = tempfile::tempdir().unwrap();
    let h = json_file(&dir, "lat.hlog");
    ok_pair("write-lat", &["-a", "-n", "20", "--histogram", &h]);
    let text = std::fs::read_to_string(&h).unwrap();
    assert_eq!(text.lines().filter(|l| l.starts_with("Tag=size=")).count(), 23, "{text}");
    assert!(text.contains("HISTEw"), "V2 base64 payloads: {text}");
    let out = run(&["write-bw", "--histogram", &h, "-p", "19996", "--connect-timeout", "1", &server_addr()]);
    assert_eq!(out.code, 2, "--histogram is for latency tests: {}", out.stderr);
    let out = run(&["write-lat", "-e", "-p", "19996", "--connect-timeout", "1", &server_addr()]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(out.stderr.contains("--with-imm"), "{}", out.stderr);
}

#[test]
fn lab_bidirectional_bandwidth_reports_both_directions() {
    for (test, extra) in [
        ("write-bw", &["--validate-data", "-s", "4096"][..]),
        ("write-bw", &["--with-imm", "-s", "4096"]),
        ("read-bw", &["--validate-data", "-s", "4096"]),
        ("send-bw", &["--validate-data", "-s", "4096"]),
        ("send-bw", &["-c", "UD", "-s", "1024"]),
        ("atomic-bw", &[]),
        ("write-bw", &["-e", "-s", "4096"]),
    ] {
        let mut args = vec!["-b", "-n", "400", "--json", "-"];
        args.extend_from_slice(extra);
        let what = format!("{test} {args:?}");
        let (c, s) = ok_pair(test, &args);
        let doc = valid_doc(&c.stdout);
        let r = &doc["results"][0];
        assert_eq!(r["bandwidth"]["messages"], 400, "{what}");
        let rev = &r["reverse_bandwidth"];
        assert_eq!(rev["messages"], 400, "{what}: the server sent as many: {rev}");
        assert!(rev["avg_bytes_per_sec"].as_f64().unwrap() > 0.0, "{what}");
        assert!(c.stderr.contains("(both directions)") && s.stdout.contains("(both directions)"), "{what}");
    }
    let out = run(&["write-lat", "-b", "-p", "19995", "--connect-timeout", "1", &server_addr()]);
    assert_eq!(out.code, 2, "{}", out.stderr);
}

#[test]
fn lab_atomic_checks_catch_a_wrong_step() {
    for op in ["FETCH_AND_ADD", "CMP_AND_SWP"] {
        // Latency: the next operation returns an unexpected old value.
        let (c, _) = pair("atomic-lat", &["-A", op, "-n", "50", "--inject-corruption", "20"], &[]);
        assert_eq!(c.code, 1, "{op}: {}", c.stderr);
        assert!(c.stderr.contains("atomic 21 returned 22"), "{op}: {}", c.stderr);
        // Bandwidth: the server's final counter does not match the number of operations.
        let (c, s) = pair("atomic-bw", &["-A", op, "-n", "300", "--inject-corruption", "299"], &[]);
        assert_eq!((c.code, s.code), (1, 1), "{op}: client {}\nserver {}", c.stderr, s.stderr);
        assert!(c.stderr.contains("the atomic counter is 301 after 300 operations"), "{op}: {}", c.stderr);
    }
}

#[test]
fn lab_several_qps_each_send_n_and_the_totals_add_up() {
    for (test, extra) in [
        ("write-bw", &["--validate-data", "-s", "4096"][..]),
        ("read-bw", &["--validate-data", "-s", "4096"]),
        ("send-bw", &["--validate-data", "-s", "1024"]),
        ("send-bw", &["-c", "UD", "-s", "1024"]),
        ("atomic-bw", &[]),
        ("write-bw", &["-b", "--with-imm", "-s", "4096"]),
        ("write-bw", &["-e", "-s", "4096"]),
    ] {
        let mut args = vec!["-q", "4", "-n", "250", "--json", "-"];
        args.extend_from_slice(extra);
        let what = format!("{test} {args:?}");
        let (c, _) = ok_pair(test, &args);
        let doc = valid_doc(&c.stdout);
        let r = &doc["results"][0];
        assert_eq!(r["iterations"], 1000, "{what}: 4 QPs x 250");
        assert_eq!(r["bandwidth"]["messages"], 1000, "{what}");
        if extra.contains(&"-b") {
            assert_eq!(r["reverse_bandwidth"]["messages"], 1000, "{what}");
        }
    }
    let out = run(&["send-lat", "-q", "2", "-p", "19994", "--connect-timeout", "1", &server_addr()]);
    assert_eq!(out.code, 2, "{}", out.stderr);
}

#[test]
fn lab_threads_split_the_qps_and_report_each() {
    for (test, extra) in [
        ("write-bw", &["--validate-data", "-s", "4096"][..]),
        ("send-bw", &["--validate-data", "-s", "1024"]),
        ("read-bw", &["-s", "4096"]),
        ("write-bw", &["-b", "-s", "4096"]),
    ] {
        let mut args = vec!["-q", "4", "--threads", "2", "-n", "250", "--json", "-"];
        args.extend_from_slice(extra);
        let what = format!("{test} {args:?}");
        let (c, _) = ok_pair(test, &args);
        let doc = valid_doc(&c.stdout);
        let r = &doc["results"][0];
        assert_eq!(r["bandwidth"]["messages"], 1000, "{what}");
        let threads = r["per_thread"].as_array().expect("per-thread figures");
        assert_eq!(threads.len(), 2, "{what}");
        for t in threads {
            assert_eq!(t["messages"], 500, "{what}: two QPs of 250 per thread");
        }
    }
    let out = run(&["write-bw", "-q", "2", "--threads", "3", "-p", "19993", "--connect-timeout", "1", &server_addr()]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(out.stderr.contains("--threads 1..=2"), "{}", out.stderr);
}

#[test]
fn lab_rdma_cm_connects_every_rc_operation() {
    for (test, extra) in [
        ("write-lat", &[][..]),
        ("write-bw", &["-q", "2", "--validate-data", "-s", "4096"]),
        ("read-lat", &[]),
        ("read-bw", &["--validate-data", "-s", "4096"]),
        ("send-lat", &["--with-imm"]),
        ("send-bw", &["-q", "3", "--validate-data", "-s", "1024"]),
        ("atomic-lat", &["-A", "CMP_AND_SWP"]),
        ("atomic-bw", &[]),
        ("write-bw", &["-m", "1024", "-s", "8192", "--validate-data"]),
    ] {
        let mut args = vec!["-R", "-n", "300", "--json", "-"];
        args.extend_from_slice(extra);
        let what = format!("{test} {args:?}");
        let (c, s) = ok_pair(test, &args);
        let doc = valid_doc(&c.stdout);
        assert_eq!(doc["spec"]["rdma_cm"], true, "{what}");
        let qps = if extra.contains(&"-q") { extra[1].parse::<u64>().unwrap() } else { 1 };
        assert_eq!(doc["results"][0]["iterations"], 300 * qps, "{what}");
        let mtu = if extra.contains(&"-m") { 1024 } else { 4096 };
        assert_eq!(doc["environment"]["mtu"], mtu, "{what}");
        assert!(c.stderr.contains("RC (rdma_cm)"), "{what}: {}", c.stderr);
        assert!(s.stdout.contains("RC (rdma_cm)"), "{what}: the server follows the client's -R: {}", s.stdout);
    }
}

#[test]
fn lab_validate_generic_passes_on_rxe_and_nccl_env_gives_index_1() {
    let out = run(&["validate", "--profile", "generic", "--expect-nics", "1", "--json", "-"]);
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    let doc: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(doc["verdict"], "pass", "{}", out.stderr);
    assert_eq!(doc["gid_index"], 1);
    let checks = doc["checks"].as_array().unwrap();
    let reg = checks.iter().find(|c| c["id"] == "register-memory").expect("a registration check");
    assert_eq!(reg["status"], "pass", "a real 64 MiB registration on rxe: {reg}");
    assert!(out.stderr.contains("verdict: PASS") && out.stderr.contains("GID index 1"), "{}", out.stderr);

    let env = run(&["nccl-env"]);
    assert_eq!(env.code, 0, "{}", env.stderr);
    assert_eq!(env.stdout, "export NCCL_IB_HCA=rxe0:1\nexport NCCL_IB_GID_INDEX=1\n");
    let bin = env!("CARGO_BIN_EXE_rdmabench");
    let shell = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("eval \"$({bin} nccl-env)\" && echo \"$NCCL_IB_HCA $NCCL_IB_GID_INDEX\""))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&shell.stdout), "rxe0:1 1\n");

    // The lab's IPv4-only RoCE cannot be ACK's pod network, which needs IPv6 GIDs.
    let out = run(&["validate", "--profile", "ack-shared-podnet"]);
    assert_eq!(out.code, 1, "{}", out.stdout);
    assert!(out.stdout.contains("FAIL  gid") && out.stdout.contains("global IPv6"), "{}", out.stdout);
    assert!(out.stderr.contains("gid (rxe0/1)"), "{}", out.stderr);
}

#[test]
fn lab_pair_profile_sees_the_shared_nic() {
    // Both sides use the lab's one rxe0: a shared mode reports it, an exclusive one fails.
    let (c, s) = ok_pair("write-lat", &["--profile", "vke-shared", "-n", "100", "--json", "-"]);
    let doc = valid_doc(&c.stdout);
    assert_eq!(doc["environment"]["peer"]["same_physical_nic"], true);
    assert_eq!(doc["spec"]["profile"], "vke-shared");
    assert!(s.stdout.contains("shared with the peer"), "{}", s.stdout);
    let (c, s) = pair("write-lat", &["--profile", "vke-exclusive", "-n", "100"], &[]);
    for (side, out) in [("client", &c), ("server", &s)] {
        assert_eq!(out.code, 1, "{side}: {}", out.stderr);
        assert!(
            out.stderr.contains("same physical NIC") && out.stderr.contains("vke-exclusive"),
            "{side}: {}",
            out.stderr
        );
    }
}

#[test]
fn lab_run_smoke_workload_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let (json, junit) = (json_file(&dir, "smoke.json"), json_file(&dir, "smoke.xml"));
    let (c, s) = run_workload(&workload_path("smoke.toml"), &["--json", &json, "--junit", &junit]);
    assert_eq!(c.code, 0, "{}\n{}", c.stdout, c.stderr);
    assert_eq!(s.code, 0, "the serving side ends when the client finishes: {}", s.stderr);
    assert!(
        c.stdout.contains("=== workload smoke: PASS ===") && c.stdout.contains("threshold max_p50_us"),
        "{}",
        c.stdout
    );
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(doc["schema"], "rdmabench/run");
    assert_eq!(doc["verdict"], "pass");
    let steps = doc["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 3);
    assert_eq!(steps[0]["kind"], "validate");
    assert_eq!(steps[1]["thresholds"][0]["pass"], true);
    assert!(steps[2]["stats"][0]["metrics"]["gbps"]["median"].as_f64().unwrap() > 0.0);
    let xml = std::fs::read_to_string(&junit).unwrap();
    let parsed = roxmltree::Document::parse(&xml).expect("well-formed JUnit");
    assert_eq!(parsed.descendants().filter(|n| n.has_tag_name("testcase")).count(), 3 + 2, "3 steps, 2 thresholds");

    // A threshold no device meets fails the run (exit 1) and its JUnit case.
    let strict = json_file(&dir, "strict.toml");
    std::fs::write(
        &strict,
        "name = \"strict\"\n[[step]]\nname = \"lat\"\ntest = \"write-lat\"\niterations = 200\n\
         [step.thresholds]\nmax_p50_us = 0.001\n",
    )
    .unwrap();
    let (c, _) = run_workload(&strict, &["--junit", &junit]);
    assert_eq!(c.code, 1, "{}\n{}", c.stdout, c.stderr);
    assert!(c.stdout.contains("FAIL") && c.stderr.contains("step(s) failed: lat"), "{}\n{}", c.stdout, c.stderr);
    assert!(std::fs::read_to_string(&junit).unwrap().contains("<failure"));

    // Ring tests run as workload steps too, with their own keys (sizes with suffixes).
    let ring = json_file(&dir, "ring.toml");
    std::fs::write(
        &ring,
        "name = \"ring\"\n[[step]]\nname = \"bw\"\ntest = \"ring-bw\"\nsize = 64\niterations = 5000\n\
         validate_data = true\ncapacity = \"64K\"\nnotify = \"poll\"\n[step.thresholds]\nmin_mpps = 0.0001\n\
         [[step]]\nname = \"lat\"\ntest = \"ring-lat\"\nsize = \"1K\"\niterations = 300\n",
    )
    .unwrap();
    let (c, s) = run_workload(&ring, &["--json", &json]);
    assert_eq!((c.code, s.code), (0, 0), "{}\n{}\n{}", c.stdout, c.stderr, s.stderr);
    assert!(
        c.stdout.contains("Ring records (poll notify, consumer spins, producer adaptive, 65536 B ring, batch 16)"),
        "{}",
        c.stdout
    );
    assert!(c.stdout.ends_with("=== workload ring: PASS ===\n"), "the verdict closes the output: {}", c.stdout);
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(doc["steps"][0]["spec"]["ring"]["capacity"], 65536);
    assert_eq!(doc["steps"][1]["spec"]["sizes"][0], 1024);
}

/// The regression gate compares runs made here and now, never a figure recorded on another
/// day or machine (this lab's speed drifts 3-4x between days): a baseline recorded at the
/// start of the test, a later run compared with it (passes), and a baseline a hundred times
/// better than that later run (every metric regresses: detection works).
#[test]
fn lab_run_regression_against_a_baseline_recorded_in_the_same_test() {
    let dir = tempfile::tempdir().unwrap();
    // The workload with every tolerance wide enough for the lab's two speed modes, which lie
    // 2x apart (write-lat p50 about 10.5 or 20 us; bandwidth halves with them) and can change
    // between two runs minutes apart, tails swinging far more on top: a baseline recorded in
    // one mode and a run in the other are the same code. p50 may grow 5x (+400 %), the tails
    // 11x (+1000 %, the most a workload takes; write-lat's p99.9 median over 5 repeats moved
    // 6.6x between the two runs of a clean lab/test on 2026-12-08, read-lat's 8x in another),
    // bandwidth and message rate may fall to a fifth (-80 %); the 100x below stays far beyond.
    let text = std::fs::read_to_string(workload_path("regression.toml")).unwrap();
    let workload = json_file(&dir, "regression.toml");
    std::fs::write(&workload, with_lab_tolerances(&text)).unwrap();
    let baseline = json_file(&dir, "baseline.json");
    let (c, _) = run_workload(&workload, &["--json", &baseline]);
    assert_eq!(c.code, 0, "recording the baseline: {}\n{}", c.stdout, c.stderr);

    let current = json_file(&dir, "current.json");
    let (c, _) = run_workload(&workload, &["--baseline", &baseline, "--json", &current]);
    assert_eq!(c.code, 0, "{}\n{}", c.stdout, c.stderr);
    assert!(c.stdout.contains("compared with") && c.stdout.contains("0 regressed"), "{}", c.stdout);

    // A baseline a hundred times better than the current run's best repeat, every repeat at
    // that figure: every metric of the current run regresses. Made from the current run, not
    // the recorded baseline: tails swing 10x between runs here (read-lat p99.9 3.8 ms in one
    // run, 0.45 ms in the next, seen), so a baseline's hundredfold could lie near them.
    let mut doc: Value = serde_json::from_str(&std::fs::read_to_string(&current).unwrap()).unwrap();
    let mut metrics = 0;
    for step in doc["steps"].as_array_mut().unwrap() {
        for size in step["stats"].as_array_mut().unwrap() {
            for (metric, s) in size["metrics"].as_object_mut().unwrap() {
                let better = if metric.ends_with("_us") {
                    s["min"].as_f64().unwrap() / 100.0
                } else {
                    s["max"].as_f64().unwrap() * 100.0
                };
                for k in ["median", "min", "max"] {
                    s[k] = better.into();
                }
                for v in s["values"].as_array_mut().unwrap() {
                    *v = better.into();
                }
                metrics += 1;
            }
        }
    }
    let tight = json_file(&dir, "tight.json");
    std::fs::write(&tight, serde_json::to_string(&doc).unwrap()).unwrap();
    let c = run(&["compare", &tight, &current]);
    assert_eq!(c.code, 1, "{}\n{}", c.stdout, c.stderr);
    assert!(c.stdout.contains(&format!("comparison: {metrics} regressed")), "all {metrics} metrics: {}", c.stdout);
    assert!(c.stderr.contains(&format!("{metrics} metric(s) regressed")), "{}", c.stderr);

    // A step of the baseline the current run lacks is missing (and fails), not "regressed":
    // the current run against a copy of itself with one step renamed.
    let mut doc: Value = serde_json::from_str(&std::fs::read_to_string(&current).unwrap()).unwrap();
    doc["steps"].as_array_mut().unwrap()[1]["name"] = "a step this run lacks".into();
    let missing = json_file(&dir, "missing.json");
    std::fs::write(&missing, serde_json::to_string(&doc).unwrap()).unwrap();
    let c = run(&["compare", &missing, &current]);
    assert_eq!(c.code, 1, "{}\n{}", c.stdout, c.stderr);
    assert!(c.stdout.contains("MISSING step \"a step this run lacks\""), "{}", c.stdout);
    assert!(c.stderr.contains("1 missing") && !c.stderr.contains("regressed"), "{}", c.stderr);
}

/// The workload's `[step.tolerance]` lines set to the lab's whole swing: latencies +400 %,
/// bandwidth and message rate -80 %. Every tolerance line is rewritten, so a metric added to
/// the workload later cannot keep a tolerance sized for dedicated hardware.
fn with_lab_tolerances(workload: &str) -> String {
    let mut out = String::new();
    let mut rewritten = 0;
    for line in workload.lines() {
        let key = line.split('=').next().unwrap_or("").trim();
        let lab = match key {
            "p50_us" => Some(400.0),
            "p99_us" | "p999_us" => Some(1000.0),
            "gbps" | "mpps" => Some(80.0),
            _ => None,
        };
        match lab {
            Some(t) if line.contains('=') => {
                out.push_str(&format!("{key} = {t:.1}\n"));
                rewritten += 1;
            }
            _ => out.push_str(&format!("{line}\n")),
        }
    }
    assert!(rewritten >= 8, "regression.toml's tolerances changed shape: {rewritten} rewritten\n{workload}");
    out
}

/// The fleet Job's own pod script, run as three "pods" on the lab host: each validates,
/// serves its ring predecessor and measures its successor (`k8s role`), prints its
/// RDMABENCH_RESULT line; `summarize` over the three logs accepts the ring, and names the
/// missing link when a pod's log is lost.
#[test]
fn lab_fleet_ring_of_three_pods_summarized() {
    let render = run(&[
        "k8s",
        "render",
        "--platform",
        "vke",
        "--mode",
        "exclusive",
        "--nics",
        "1",
        "--pods",
        "3",
        "--topology",
        "ring",
        "--workload",
        "smoke",
    ]);
    assert_eq!(render.code, 0, "{}", render.stderr);
    let job: Value =
        render.stdout.split("\n---\n").map(|d| serde_norway::from_str::<Value>(d).unwrap()).nth(1).unwrap();
    assert_eq!(job["spec"]["completions"], 3);
    let container = &job["spec"]["template"]["spec"]["containers"][0];
    let dir = tempfile::tempdir().unwrap();
    // Three consecutive ports: pod i listens on RDMABENCH_PORT + i.
    let base = next_port();
    next_port();
    next_port();
    let pods: Vec<Child> = (0..3)
        .map(|i| {
            let mut cmd = pod(&[], container, i, &base, dir.path());
            // Also unlike a cluster: the lab's device is rxe (the generic profile).
            cmd.env("RDMABENCH_PROFILE", "generic").env("RDMABENCH_PEER_ADDR", server_addr());
            cmd.spawn().expect("start a pod script")
        })
        .collect();
    let outs: Vec<Out> = pods.into_iter().map(|p| finish(p, Duration::from_secs(300))).collect();
    let mut logs = Vec::new();
    for (i, o) in outs.iter().enumerate() {
        assert_eq!(o.code, 0, "pod {i}:\n{}\n{}", o.stdout, o.stderr);
        let term = std::fs::read_to_string(dir.path().join(format!("term-{i}"))).unwrap();
        assert_eq!(term.trim(), format!("pod {i} -> pod {}: workload smoke PASS (exit 0)", (i + 1) % 3));
        assert!(o.stdout.contains("=== workload smoke: PASS ==="), "pod {i} serves and measures: {}", o.stdout);
        let log = dir.path().join(format!("pod-{i}.log"));
        std::fs::write(&log, &o.stdout).unwrap();
        logs.push(log.display().to_string());
    }
    let mut args = vec!["summarize", "--pods", "3", "--topology", "ring"];
    args.extend(logs.iter().map(String::as_str));
    let s = run(&args);
    assert_eq!(s.code, 0, "{}\n{}", s.stdout, s.stderr);
    for link in ["0 -> 1", "1 -> 2", "2 -> 0"] {
        assert!(s.stdout.contains(link), "{link} in\n{}", s.stdout);
    }
    assert!(s.stdout.contains("3 link(s), 0 failed"), "{}", s.stdout);
    let mut args = vec!["summarize", "--json", "--pods", "3", "--topology", "ring"];
    args.extend(logs.iter().map(String::as_str));
    let rows: Value = serde_json::from_str(&run(&args).stdout).unwrap();
    assert!(rows.as_array().unwrap().iter().all(|r| r["ok"] == true && r["gbps"].as_f64().unwrap() > 0.0), "{rows}");

    // Pod 2's log lost: its link is named as missing and the fleet fails.
    let s = run(&["summarize", "--pods", "3", "--topology", "ring", &logs[0], &logs[1]]);
    assert_eq!(s.code, 1, "{}", s.stdout);
    assert!(s.stdout.contains("FAILED: no result") && s.stderr.contains("2 -> 0"), "{}\n{}", s.stdout, s.stderr);
}

/// Hosts named as a bare VM names itself, `(none)`, or with 64 bytes of spaces and UTF-8
/// run a test both ways and show both names defused in their tables and JSON.
#[test]
fn lab_hosts_named_none_or_anything_run_write_lat_and_show_the_names_defused() {
    let (odd, odd_shown) = odd_host();
    let dir = tempfile::tempdir().unwrap();
    let (cjson, sjson) = (json_file(&dir, "client.json"), json_file(&dir, "server.json"));
    let port = next_port();
    let server = spawn_in(
        &host_named("(none)"),
        &["write-lat", "-p", &port, "--connect-timeout", "30", "--timeout", "5", "--json", &sjson],
    );
    let addr = server_addr();
    let c =
        run_in(&host_named(&odd), &["write-lat", "-n", "200", "-p", &port, "--timeout", "5", "--json", &cjson, &addr]);
    let s = finish(server, Duration::from_secs(30));
    assert_eq!(c.code, 0, "client:\n{}\n{}", c.stdout, c.stderr);
    assert_eq!(s.code, 0, "server:\n{}\n{}", s.stdout, s.stderr);
    let (client, server) =
        (valid_doc(&std::fs::read_to_string(&cjson).unwrap()), valid_doc(&std::fs::read_to_string(&sjson).unwrap()));
    assert_eq!(client["environment"]["host"], odd_shown.as_str(), "{client}");
    assert_eq!(client["environment"]["peer"]["host"], "(none)", "{client}");
    assert_eq!(server["environment"]["host"], "(none)", "{server}");
    assert_eq!(server["environment"]["peer"]["host"], odd_shown.as_str(), "{server}");
    assert_eq!(client["results"][0]["latency"]["samples"], 200, "{client}");
    for (out, mine, theirs) in
        [(&c.stdout, &odd_shown, "(none)"), (&s.stdout, &"(none)".to_string(), odd_shown.as_str())]
    {
        let local = out.lines().find(|l| l.contains("local  GID index")).unwrap_or_else(|| panic!("{out}"));
        let remote = out.lines().find(|l| l.contains("remote GID index")).unwrap_or_else(|| panic!("{out}"));
        assert!(local.contains(&format!(" on {mine})")), "{local}");
        assert!(remote.contains(&format!(" on {theirs},")), "{remote}");
    }
    assert!(
        !format!("{}{}{}{}", c.stdout, c.stderr, s.stdout, s.stderr).contains(&odd),
        "the raw name is never printed"
    );
}

/// A `run --serve` server on a host named `(none)`: a hand-made hello whose node name is
/// raw (escape sequence, space, UTF-8: what an older rdmabench or another client may send)
/// is welcomed and logged defused; one longer than any rdmabench sends is refused with
/// code 2 and the fix; the server lives on and serves a workload from a host with an odd
/// name, and both sides' names are in its run document.
#[test]
fn lab_a_server_named_none_defuses_what_peers_call_themselves_and_serves_a_workload() {
    use std::io::Write;
    let (odd, odd_shown) = odd_host();
    let dir = tempfile::tempdir().unwrap();
    let workload = dir.path().join("names.toml");
    std::fs::write(
        &workload,
        "name = \"names\"\ndescription = \"one short latency step\"\n\n[[step]]\nname = \"write latency 2 B\"\n\
         test = \"write-lat\"\nsize = 2\niterations = 300\n",
    )
    .unwrap();
    let port = next_port();
    let server =
        spawn_in(&host_named("(none)"), &["run", "--serve", "-p", &port, "--timeout", "3", "--connect-timeout", "60"]);
    let hello: Value = serde_json::from_str(&captured_hello(&["write-lat", "-n", "10"])).unwrap();
    let replay = |node: &str| {
        let mut h = hello.clone();
        h["node"] = node.into();
        let mut raw = connect_raw(&port);
        assert!(read_frame(&mut raw).contains("greeting"));
        raw.write_all(&frame(&h.to_string())).unwrap();
        let answer: Value = serde_json::from_str(&read_frame(&mut raw)).unwrap();
        answer
    };
    let welcome = replay("old client\u{1b}[2J \u{fc}");
    assert_eq!((welcome["type"].as_str(), welcome["node"].as_str()), (Some("welcome"), Some("(none)")), "{welcome}");
    let refuse = replay(&"n".repeat(300));
    assert_eq!((refuse["type"].as_str(), refuse["code"].as_i64()), (Some("refuse"), Some(2)), "{refuse}");
    let why = refuse["message"].as_str().unwrap();
    assert!(
        why.contains("300 bytes") && why.contains("at most 253") && why.contains("same rdmabench version"),
        "{why}"
    );

    let run_json = json_file(&dir, "run.json");
    let args = [
        "run",
        workload.to_str().unwrap(),
        "--peer",
        &server_addr(),
        "-p",
        &port,
        "--connect-timeout",
        "30",
        "--json",
        &run_json,
    ];
    let c = finish(spawn_in(&host_named(&odd), &args), Duration::from_secs(120));
    assert_eq!(c.code, 0, "{}\n{}", c.stdout, c.stderr);
    let s = finish(server, Duration::from_secs(60));
    assert_eq!(s.code, 0, "served both strangers and the workload, and ended with it: {}\n{}", s.stdout, s.stderr);
    assert!(s.stderr.contains("peer old%20client%5Cu%7B1b%7D%5B2J%20%C3%BC ("), "logged defused: {}", s.stderr);
    assert!(s.stderr.contains("at most 253"), "the refusal is logged: {}", s.stderr);
    assert!(!s.stderr.contains('\u{1b}'), "{}", s.stderr);
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&run_json).unwrap()).unwrap();
    assert_eq!(doc["verdict"], "pass", "{doc}");
    assert_eq!(doc["environment"]["host"], odd_shown.as_str(), "{doc}");
    assert_eq!(doc["environment"]["peer"]["host"], "(none)", "{doc}");
}

/// The rendered Job's pod script on hosts named `(none)`: validate, the workload through
/// `run --serve`, the result line, and `summarize` of the pods' logs naming both nodes.
#[test]
fn lab_a_job_on_nodes_named_none_runs_and_is_summarized() {
    let job = rendered_job(&["--platform", "vke", "--mode", "exclusive", "--nics", "1", "--workload", "smoke"]);
    let container = &job["spec"]["template"]["spec"]["containers"][0];
    let dir = tempfile::tempdir().unwrap();
    let base = next_port();
    next_port();
    let pods: Vec<Child> = (0..2)
        .map(|i| {
            let mut cmd = pod(&host_named("(none)"), container, i, &base, dir.path());
            cmd.env("RDMABENCH_PROFILE", "generic").env("RDMABENCH_PEER_ADDR", server_addr());
            cmd.spawn().expect("start a pod script")
        })
        .collect();
    let outs: Vec<Out> = pods.into_iter().map(|p| finish(p, Duration::from_secs(300))).collect();
    for (i, o) in outs.iter().enumerate() {
        assert_eq!(o.code, 0, "pod {i}:\n{}\n{}", o.stdout, o.stderr);
    }
    assert!(outs[1].stdout.contains("=== workload smoke: PASS ==="), "{}", outs[1].stdout);
    let line = outs[1].stdout.lines().find(|l| l.starts_with("RDMABENCH_RESULT ")).expect("the result line");
    assert!(line.contains(r#""node":"(none)""#), "{line}");
    let log = dir.path().join("pods.log");
    std::fs::write(&log, format!("{}\n{}", outs[0].stdout, outs[1].stdout)).unwrap();
    let s = run(&["summarize", log.to_str().unwrap()]);
    assert_eq!(s.code, 0, "{}\n{}", s.stdout, s.stderr);
    assert!(s.stdout.contains("1 link(s), 0 failed"), "{}", s.stdout);
    let rows: Value = serde_json::from_str(&run(&["summarize", "--json", log.to_str().unwrap()]).stdout).unwrap();
    assert_eq!((rows[0]["node"].as_str(), rows[0]["peer_node"].as_str()), (Some("(none)"), Some("(none)")), "{rows}");
    assert_eq!(rows[0]["ok"], true, "{rows}");
}

// ---- The zero-copy ring (rdmabench::ring, ring-bw, ring-lat) ----

/// ring-bw and ring-lat in both notify modes over a small ring (hundreds of wraps), every
/// record numbered and checksummed; a sweep keeps every size's JSON; a corrupted record is
/// caught where it lands.
#[test]
fn lab_ring_both_notify_modes_wrap_many_times_with_validated_data() {
    for notify in ["imm", "poll"] {
        // 4 KiB ring, 128 B per record: 32 records a lap, 625 laps.
        let args = ["--notify", notify, "--capacity", "4096", "-s", "100", "-n", "20000", "--validate-data"];
        let (c, s) = ok_pair("ring-bw", &[&args[..], &["--json", "-"]].concat());
        let doc = valid_doc(&c.stdout);
        let r = &doc["results"][0];
        assert_eq!(doc["spec"]["ring"]["notify"], notify);
        assert_eq!(r["iterations"], 20000);
        assert_eq!(r["bandwidth"]["bytes"], 100 * 20000);
        assert_eq!(r["data_validated"], true);
        assert!(r["bandwidth"]["msg_rate_mpps"].as_f64().unwrap() > 0.0);
        let wait = if notify == "poll" { "consumer spins, producer adaptive" } else { "adaptive wait" };
        assert!(s.stdout.contains(&format!("Ring records ({notify} notify, {wait}, 4096 B ring")), "{}", s.stdout);

        let dir = tempfile::tempdir().unwrap();
        let f = json_file(&dir, "lat.json");
        let args =
            ["--notify", notify, "--capacity", "4096", "-s", "64", "-n", "3000", "--validate-data", "--json", &f];
        let (c, _) = ok_pair("ring-lat", &args);
        assert!(c.stdout.contains("one-way latency"), "{}", c.stdout);
        let doc = valid_doc(&std::fs::read_to_string(&f).unwrap());
        let l = &doc["results"][0]["latency"];
        assert_eq!(l["samples"], 3000);
        assert!(l["min_ns"].as_f64().unwrap() > 0.0 && l["p50_ns"].as_f64() <= l["max_ns"].as_f64(), "{l}");
    }
    // Every size of a sweep, each on a fresh ring.
    let (c, _) = ok_pair("ring-bw", &["-a", "-n", "20", "--capacity", "16M", "--json", "-"]);
    let doc = valid_doc(&c.stdout);
    let sizes: Vec<u64> = doc["results"].as_array().unwrap().iter().map(|r| r["size"].as_u64().unwrap()).collect();
    assert_eq!(sizes, (1..=23).map(|p| 1u64 << p).collect::<Vec<_>>());
    // One flipped byte in record 777: the consumer's checksum catches it.
    let (c, s) = pair("ring-bw", &["--validate-data", "-s", "256", "-n", "2000", "--inject-corruption", "777"], &[]);
    assert_eq!((c.code, s.code), (1, 1), "client: {}\nserver: {}", c.stderr, s.stderr);
    assert!(c.stderr.contains("record 777") && c.stderr.contains("checksum"), "{}", c.stderr);
}

/// Every wait mode of both notify modes moves every record intact through a small ring
/// (the producer keeps meeting a full ring, so it waits for credit: asleep in sleep mode);
/// ring-lat sleeps too; and a peer killed while the other side sleeps is seen within the
/// deadline, on either side.
#[test]
fn lab_ring_wait_modes_deliver_every_record_and_a_sleeping_side_sees_a_killed_peer() {
    for notify in ["imm", "poll"] {
        for wait in ["spin", "sleep", "adaptive"] {
            let args = ["--notify", notify, "--wait", wait, "--capacity", "8K", "-s", "1000", "-n", "3000"];
            let (c, _) = ok_pair("ring-bw", &[&args[..], &["--validate-data", "--json", "-"]].concat());
            let doc = valid_doc(&c.stdout);
            assert_eq!(
                (doc["spec"]["ring"]["wait"].as_str(), doc["results"][0]["iterations"].as_u64()),
                (Some(wait), Some(3000))
            );
            assert_eq!(doc["results"][0]["data_validated"], true);
        }
    }
    // A polling ring's sweep: every size on the same connection, whose wake-up receives
    // are posted once (posted per size, they overflowed the receive queue at the second).
    let (c, _) = ok_pair("ring-bw", &["-a", "-n", "20", "--capacity", "16M", "--notify", "poll", "--json", "-"]);
    assert_eq!(valid_doc(&c.stdout)["results"].as_array().unwrap().len(), 23);
    // The consumer's CPU: a spinning one burns its core while it waits for each 64 KiB
    // record; a sleeping one does not.
    let consumer_cpu = |wait: &str| {
        let (c, _) = ok_pair("ring-bw", &["--wait", wait, "-n", "300", "--cpu-util", "--json", "-"]);
        let r = valid_doc(&c.stdout)["results"][0].clone();
        assert!(c.stderr.contains("CPU per message at 65536 B: this side "), "{}", c.stderr);
        r["peer_cpu_util_pct"].as_f64().unwrap()
    };
    let (spin, sleep) = (consumer_cpu("spin"), consumer_cpu("sleep"));
    eprintln!("consumer CPU while ring-bw 64 KiB runs: spin {spin:.1} %, sleep {sleep:.1} %");
    assert!(sleep < 0.8 * spin, "sleeping saves CPU: spin {spin:.1} %, sleep {sleep:.1} %");
    let (c, _) = ok_pair(
        "ring-lat",
        &["--notify", "imm", "--wait", "sleep", "-s", "64", "-n", "500", "--validate-data", "--json", "-"],
    );
    assert_eq!(valid_doc(&c.stdout)["results"][0]["latency"]["samples"], 500);
    for server_dies in [true, false] {
        let (_, other, waited) =
            disrupt_with("ring-bw", &["--wait", "sleep", "--capacity", "8K"], server_dies, libc::SIGKILL);
        assert_eq!(other.code, 4, "server dies: {server_dies}: {}", other.stderr);
        assert!(waited < Duration::from_secs(3) + GRACE, "server dies: {server_dies}: took {waited:?} (timeout 3 s)");
    }
}

/// The documented example program: records of random sizes (16 B to 3000 B) through a
/// 16 KiB ring, checked in order and by checksum on the consumer; then a slow consumer:
/// the producer meets a full ring, waits, and nothing is lost.
#[test]
fn lab_ring_example_program_random_sizes_and_a_slow_consumer() {
    let example = std::path::Path::new(BIN).parent().unwrap().join("examples/ring");
    assert!(example.exists(), "build the example first: cargo build --release --example ring");
    let ex = |args: &[&str]| {
        Command::new(&example).args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap()
    };
    let addr = server_addr();
    for (notify, records, delay, capacity) in
        [("imm", "20000", "0", "16K"), ("poll", "20000", "0", "16K"), ("imm", "400", "500", "8K")]
    {
        let port = next_port();
        let consumer = ex(&["consume", "-p", &port, "--delay-us", delay]);
        let producer = ex(&[
            "produce",
            &addr,
            "-p",
            &port,
            "--records",
            records,
            "--min-size",
            "16",
            "--max-size",
            "3000",
            "--capacity",
            capacity,
            "--notify",
            notify,
        ]);
        let p = finish(producer, Duration::from_secs(120));
        let c = finish(consumer, Duration::from_secs(30));
        assert_eq!((p.code, c.code), (0, 0), "{notify}: producer {}\nconsumer {}", p.stderr, c.stderr);
        assert!(c.stdout.contains(&format!("consumed {records} records")), "{}", c.stdout);
        assert!(c.stdout.contains("in order, checksums ok"), "{}", c.stdout);
        let waits: u64 = p.stdout.split("full ").nth(1).and_then(|t| t.split(' ').next()).unwrap().parse().unwrap();
        if delay != "0" {
            // 400 records of ~1.5 KB through 8 KiB, consumed at 2000/s: the ring fills often.
            assert!(waits > 50, "the producer should have met a full ring: {}", p.stdout);
        }
    }
}

/// The library's edges, in one process over rxe: a record of exactly the ring's free
/// space (the whole empty ring) fits; the next waits for it to be consumed (`try_reserve`
/// and `reserve_within` say so without blocking); one byte more is a clear error.
#[test]
fn lab_ring_exact_free_space_fits_and_a_larger_record_is_refused() {
    use rdmabench::ring::{Consumer, Notify, Producer, RingConfig};
    use rdmabench::verbs::DeviceSelection;
    let device = DeviceSelection { device: None, port: 1, gid_index: None };
    let port: u16 = next_port().parse().unwrap();
    let timeout = Duration::from_secs(5);
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let consumer = std::thread::spawn(move || -> Vec<(usize, u8)> {
        let dev = DeviceSelection { device: None, port: 1, gid_index: None };
        let c = Consumer::accept(port, &dev, timeout).expect("accept");
        let mut seen = Vec::new();
        while let Some(r) = c.recv().expect("recv") {
            seen.push((r.len(), r[r.len() - 1]));
            if seen.len() == 1 {
                // Hold the first (ring-filling) record until the producer has seen the
                // ring full.
                release_rx.recv().unwrap();
            }
        }
        seen
    });
    let config = RingConfig { capacity: 4096, notify: Notify::Poll, ..RingConfig::default() };
    let mut p = Producer::connect(&server_addr(), port, &device, config, timeout).expect("connect");
    let max = p.max_record();
    assert_eq!(max, 4096 - 8, "a record's frame word takes 8 B");
    let mut slot = p.reserve(max).expect("the whole empty ring is free");
    slot.fill(0xa5);
    slot.commit().unwrap();
    p.flush().unwrap();
    assert!(p.try_reserve(1).unwrap().is_none(), "full: try_reserve does not block");
    let t = Instant::now();
    assert!(p.reserve_within(1, Duration::from_millis(300)).unwrap().is_none());
    assert!(t.elapsed() >= Duration::from_millis(300) && t.elapsed() < Duration::from_secs(2));
    let err = p.reserve(max + 1).err().expect("one byte more than the ring holds");
    assert_eq!(err.exit_code(), 2, "{err}");
    let msg = err.to_string();
    assert!(msg.contains(&format!("at most {max} B")) && msg.contains("larger capacity"), "{msg}");
    release_tx.send(()).unwrap();
    let mut slot = p.reserve(max).expect("free again once consumed");
    slot.fill(0x5a);
    slot.commit().unwrap();
    p.finish().unwrap();
    assert_eq!(consumer.join().unwrap(), vec![(max, 0xa5), (max, 0x5a)]);
}

// ---- Several NICs per side: `lab/run --nics 2` (rxea0/rxea1 - cables - rxeb0/rxeb1) ----
// lab/test runs the tests named lab_rails_* in a guest of their own with two cables.

/// --warmup runs its iterations before the size and leaves them out of its figures: the
/// device sent the warm-up's packets, the size's own counters and samples have only its
/// measured iterations.
#[test]
fn lab_warmup_runs_before_each_size_and_stays_out_of_its_figures() {
    let before = hw_counter("sent_pkts");
    let (c, s) = pair("write-lat", &["-n", "1000", "--warmup", "700", "-s", "64", "--json", "-"], &[]);
    let sent = hw_counter("sent_pkts") - before;
    assert_eq!((c.code, s.code), (0, 0), "{}\n{}", c.stderr, s.stderr);
    let doc = valid_doc(&c.stdout);
    let r = &doc["results"][0];
    assert_eq!((doc["spec"]["warmup"].as_u64(), r["iterations"].as_u64()), (Some(700), Some(1000)), "{doc}");
    assert_eq!(r["latency"]["samples"].as_u64(), Some(1000), "{r}");
    // Loopback on one device: both sides count here, each write and its ACK: 4 packets
    // per iteration.
    let measured = r["counters"]["sent_pkts"].as_u64().unwrap();
    assert!((4000..4100).contains(&measured), "the size's own packets: {r}");
    assert!(sent >= 4 * (1000 + 700), "the warm-up ran too: {sent} packets in all");
    assert!(c.stderr.contains("Warm-up        : 700 iterations before each size"), "{}", c.stderr);
    eprintln!("sent_pkts: {sent} in all, {measured} in the measured size");
}

/// Memory variants: relaxed ordering is requested by default and reported (rxe accepts
/// the optional flag and has no PCIe function to say more); --hugepages without reserved
/// huge pages is refused with the pool's state and the fix, and with some reserved moves
/// every byte intact from huge pages; --odp is refused on rxe with the device's reason.
#[test]
fn lab_memory_relaxed_ordering_hugepages_and_odp() {
    let memory = |args: &[&str]| {
        let mut a = vec!["-n", "200", "-s", "64K", "--validate-data", "--json", "-"];
        a.extend_from_slice(args);
        let (c, s) = pair("write-bw", &a, &[]);
        assert_eq!((c.code, s.code), (0, 0), "{args:?}: {}\n{}", c.stderr, s.stderr);
        (valid_doc(&c.stdout)["environment"]["memory"].clone(), c.stderr)
    };
    let (on, table) = memory(&[]);
    assert_eq!((on["relaxed_ordering"].as_bool(), on["page_bytes"].as_u64()), (Some(true), Some(4096)), "{on}");
    assert!(on.get("pcie_relaxed_ordering").is_none(), "soft-RoCE has no PCIe function: {on}");
    assert!(table.contains("Memory         : 4 KiB pages, pinned, relaxed ordering requested"), "{table}");
    let (off, table) = memory(&["--no-relaxed-ordering"]);
    assert_eq!(off["relaxed_ordering"].as_bool(), Some(false), "{off}");
    assert!(table.contains("relaxed ordering off"), "{table}");

    set_huge_pages(0);
    let refused = run(&["write-bw", "--hugepages", "-s", "64K", "-n", "10", &server_addr()]);
    assert_eq!(refused.code, 3, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("--hugepages: cannot map")
            && refused.stderr.contains("0 are free")
            && refused.stderr.contains("/proc/sys/vm/nr_hugepages"),
        "{}",
        refused.stderr
    );
    set_huge_pages(64);
    let (huge, table) = memory(&["--hugepages"]);
    set_huge_pages(0);
    assert_eq!(huge["page_bytes"].as_u64(), Some(2 << 20), "{huge}");
    assert!(table.contains("2048 KiB huge pages"), "{table}");

    let odp = run(&["write-bw", "--odp", "-n", "10", &server_addr()]);
    assert_eq!(odp.code, 2, "{}", odp.stderr);
    assert!(odp.stderr.contains("--odp: the device refused an on-demand-paging registration"), "{}", odp.stderr);
    eprintln!("{}", odp.stderr.trim());
}

/// A soak: 12 s of write-bw with --interval 1 gives 12 intervals (terminal, JSON lines, the
/// final document); a write-lat soak stopped by Ctrl-C 12 s after its start writes a valid
/// document with the intervals so far and exits 130, and the server hears why. (Seconds,
/// not minutes: an interval's bookkeeping is the same at any length, and lab/test's time
/// is the CI's.)
#[test]
fn lab_soak_reports_every_interval_and_ctrl_c_keeps_what_was_measured() {
    let dir = tempfile::tempdir().unwrap();
    let (json, log) = (json_file(&dir, "soak.json"), json_file(&dir, "soak.jsonl"));
    let (c, s) = pair("write-bw", &["-D", "12", "--interval", "1", "--json", &json, "--interval-log", &log], &[]);
    assert_eq!((c.code, s.code), (0, 0), "{}\n{}", c.stderr, s.stderr);
    let doc = valid_doc(&std::fs::read_to_string(&json).unwrap());
    let intervals = doc["results"][0]["intervals"].as_array().unwrap().clone();
    assert_eq!(intervals.len(), 12, "{intervals:?}");
    assert!(intervals.iter().all(|i| i["gbps"].as_f64().unwrap() > 0.0), "{intervals:?}");
    // An interval ends at the first completion past its boundary: its real span.
    let last_start = intervals[11]["start_s"].as_f64().unwrap();
    assert!((11.0..12.0).contains(&last_start), "{intervals:?}");
    let lines: Vec<Value> =
        std::fs::read_to_string(&log).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines, intervals, "the JSON lines are the document's intervals");
    assert_eq!(c.stdout.matches(" interval ").count(), 12, "{}", c.stdout);
    // Ctrl-C half way through a latency soak.
    let port = next_port();
    let server = spawn(&["write-lat", "-p", &port, "--connect-timeout", "30", "--timeout", "5"]);
    let json = json_file(&dir, "stopped.json");
    let addr = server_addr();
    let client =
        spawn(&["write-lat", "-p", &port, "--timeout", "5", "-D", "60", "--interval", "1", "--json", &json, &addr]);
    let pid = client.id() as i32;
    std::thread::sleep(Duration::from_secs(12));
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    let stopped = Instant::now();
    let c = finish(client, Duration::from_secs(30));
    let waited = stopped.elapsed();
    let s = finish(server, Duration::from_secs(30));
    assert_eq!(c.code, 130, "{}\n{}", c.stdout, c.stderr);
    assert!(waited < Duration::from_secs(5), "the size ended at once: {waited:?}");
    let doc = valid_doc(&std::fs::read_to_string(&json).unwrap());
    let r = &doc["results"][0];
    let intervals = r["intervals"].as_array().unwrap();
    let end = intervals.last().unwrap()["end_s"].as_f64().unwrap();
    // The client's set-up (connect, QPs) takes a second or two of the 12 under emulation.
    assert!((5..=13).contains(&intervals.len()) && (5.0..13.0).contains(&end), "{intervals:?}");
    assert!(intervals.iter().all(|i| i["latency"]["p50_ns"].as_f64().unwrap() > 0.0), "{intervals:?}");
    assert!(r["latency"]["samples"].as_u64().unwrap() > 0, "{r}");
    assert!(s.code != 0 && s.stderr.contains("signal 2"), "the server hears why: {}", s.stderr);
    eprintln!("stopped after {end:.1} s with {} intervals, {waited:?} after the signal", intervals.len());
}

/// docs/ci.md's flow on rxe: fifteen write-bw runs into a history, the last five slowed by
/// a busy neighbour (a CPU hog on each vCPU at nice -5: the benchmark keeps about a quarter
/// of the guest's CPU, where the runs' own spread is about 20 %); `history check` finds the
/// step at the first slowed run (give or take one), fails, and each run's document carries
/// the kernel and the driver.
#[test]
fn lab_history_check_names_an_injected_slowdown() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("history.sqlite");
    let store = store.to_str().unwrap();
    let mut hogs: Vec<std::process::Child> = Vec::new();
    for i in 0..15 {
        if i == 10 {
            for cpu in ["0", "1"] {
                let hog = std::process::Command::new("nice")
                    .args(["-n", "-5", "taskset", "-c", cpu, "sh", "-c", "while :; do :; done"])
                    .spawn()
                    .expect("nice and taskset");
                hogs.push(hog);
            }
        }
        let json = json_file(&dir, &format!("run{i}.json"));
        let (c, s) = pair("write-bw", &["-s", "65536", "-n", "300", "--json", &json], &[]);
        assert_eq!((c.code, s.code), (0, 0), "run {i}: {}\n{}", c.stderr, s.stderr);
        let add = run(&["history", "add", &json, "--store", store, "--label", &format!("r{i}")]);
        assert_eq!(add.code, 0, "{}", add.stderr);
    }
    for mut h in hogs {
        // `nice` execs taskset, which execs sh: the pid is the hog's.
        let _ = h.kill();
        let _ = h.wait();
    }
    let check = run(&["history", "check", "--store", store, "--metric", "gbps"]);
    let show = run(&["history", "show", "--store", store, "--metric", "gbps"]);
    println!("{}\n{}", check.stdout, show.stdout);
    assert_eq!(check.code, 1, "the slowdown fails the check:\n{}\n{}\n{}", check.stdout, check.stderr, show.stdout);
    assert!(check.stdout.contains("REGRESSED  write_bw write_bw 65536 B gbps"), "{}", check.stdout);
    let at = ["change at run 10 (r9)", "change at run 11 (r10)", "change at run 12 (r11)"];
    assert!(at.iter().any(|a| check.stdout.contains(a)), "the step at the first slowed run: {}", check.stdout);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert!(show.stdout.contains(&format!("kernel {}", kernel.trim())), "{}", show.stdout);
    assert!(show.stdout.contains("driver rdma_rxe"), "{}", show.stdout);
}

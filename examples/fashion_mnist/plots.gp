# Plots of an experiment directory. Called as: gnuplot -e "dir='DIR'; target=0.8" plots.gp
# Reads curves.csv, summary.csv and panels.txt (one panel a line: "title|scheme scheme ...|reference"),
# which the experiment writes.
if (!exists("dir")) dir = "."
if (!exists("target")) target = 0.8
set datafile separator ","
panels = dir."/panels.txt"
npanels = int(system("wc -l < '".panels."'"))
field(i, k) = system(sprintf("sed -n '%dp' '%s' | cut -d'|' -f%d", i, panels, k))

# Lines are told apart by colour and point type, both taken by position inside a panel, so no two lines of
# one panel share either. Ten colours far apart in hue and lightness (gnuplot's default cycle repeats after
# eight and has near-twins); grey is kept for the reference line.
colours = "#1f77b4 #d62728 #2ca02c #ff7f0e #9467bd #17becf #8c564b #e377c2 #bcbd22 #000000"
points = "7 5 9 11 13 15 4 6 8 10"
colour(j) = word(colours, (int(j) - 1) % 10 + 1)
point(j) = int(word(points, (int(j) - 1) % 10 + 1))

# Each panel scales its own time axis, so lines close in time spread out; the grey reference line and the last
# panel carry the comparison across families. One accuracy range for all, from 0.5: below it lie only the
# first evaluations, and the target region is what the panels must resolve.
stats dir."/curves.csv" every ::1 using 11 nooutput name "A"

# Layout: the family panels four to a row, then the best-of-families panel across the whole width. Legends sit
# under their panel (no corner of an accuracy plot is free of curves in every run); the fixed bottom margin
# keeps the panels of a row the same height whatever their number of lines.
cols = 4
rows = int(ceil((npanels - 1) / (cols * 1.0)))
title_px = 50.0
family_px = 520.0
best_px = 620.0
height = title_px + rows * family_px + best_px
set terminal pngcairo size 2000, height noenhanced font ",11"
set output dir."/accuracy_vs_time.png"
set multiplot title "Fashion-MNIST: test accuracy vs modelled cluster time (measured compute + modelled communication); grey dashed: ring SSGD, dotted: the target" font ",15"
set logscale x
set yrange [(A_min > 0.5 ? A_min - 0.02 : 0.5) : A_max + 0.01]
set xlabel "modelled time (s), log scale" offset 0, 0.3
set ylabel "test accuracy"
set grid
set arrow 1 from graph 0, first target to graph 1, first target nohead dt 3 lw 1.5 lc rgb "#555555"
do for [i = 1:npanels] {
  members = field(i, 2)
  reference = field(i, 3)
  set title field(i, 1) font ",13"
  if (i < npanels) {
    set size 1.0 / cols, family_px / height
    set origin ((i - 1) % cols) * 1.0 / cols, (best_px + (rows - 1 - int((i - 1) / cols)) * family_px) / height
    set bmargin 7.5
    set key below left Left reverse maxrows 3 width -3 samplen 3 spacing 1.1 font ",10"
  } else {
    set size 1.0, best_px / height
    set origin 0, 0
    set bmargin 6
    set key below left Left reverse maxcols 4 samplen 3 spacing 1.1 font ",12"
  }
  if (strlen(reference) > 0) {
    plot dir."/curves.csv" every ::1 using (strcol(1) eq reference ? $6 : NaN):11 with lines dt 2 lw 2 \
           lc rgb "#999999" title reference." (reference)", \
         for [j = 1:words(members)] dir."/curves.csv" every ::1 \
           using (strcol(1) eq word(members, j) ? $6 : NaN):11 with linespoints lw 1.5 pt point(j) ps 1.2 \
           lc rgb colour(j) title word(members, j)
  } else {
    plot for [j = 1:words(members)] dir."/curves.csv" every ::1 \
           using (strcol(1) eq word(members, j) ? $6 : NaN):11 with linespoints lw 1.5 pt point(j) ps 1.2 \
           lc rgb colour(j) title word(members, j)
  }
}
unset multiplot

# Bytes each node sends over the run: one bar per scheme, coloured by family (summary.csv column 14, its
# position in families.hpp), a gap between families; received is the cross on each bar.
reset
set datafile separator ","
nfamilies = int(system("tail -n +2 '".dir."/summary.csv' | cut -d, -f14 | sort -n | tail -1"))
family_of(f) = system(sprintf("tail -n +2 '%s/summary.csv' | awk -F, '$14 == %d {print $15; exit}'", dir, f))
# Bar x: the row number plus a gap at each change of family (k counts the changes; reset at the first row).
gap = 0.8
bar_x(f) = (column(0) == 0 ? (k = 0, prev = f) : (f != prev ? (k = k + 1, prev = f) : 0), column(0) + gap * k)
colour_int(f) = int("0x".substr(colour(f), 2, 7))
set terminal pngcairo size 1600, 760 noenhanced font ",11"
set output dir."/bytes_per_scheme.png"
set title "Traffic per node over the run (largest over ranks): bar = MB sent, cross = MB received" font ",13"
set ylabel "MB per node (log scale)"
set logscale y
set grid ytics
set style fill solid 0.85 border -1
set boxwidth 0.8
set xtics rotate by -45 left font ",10" nomirror
set key outside right top
set xrange [-0.8 : *]
plot dir."/summary.csv" every ::1 using (bar_x($14)):($8 / 1e6):(colour_int($14)):xtic(1) with boxes \
       lc rgb variable notitle, \
     '' every ::1 using (bar_x($14)):($9 / 1e6) with points pt 2 ps 1.5 lw 2 lc rgb "#000000" title "received", \
     for [f = 1:nfamilies] keyentry with boxes lc rgb colour(f) title family_of(f)
